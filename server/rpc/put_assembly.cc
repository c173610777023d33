#include "server/rpc/put_assembly.h"

#include "server/rpc/convert.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace opserve {

absl::Status PutAssembly::OnMessage(const v1::PutTensorRequest& msg) {
  switch (msg.kind_case()) {
    case v1::PutTensorRequest::kHeader:
      return OnHeader(msg.header());
    case v1::PutTensorRequest::kChunk:
      return OnChunk(msg.chunk());
    default:
      return absl::InvalidArgumentError("a PutTensor message carries neither header nor chunk");
  }
}

absl::Status PutAssembly::OnHeader(const v1::PutTensorHeader& h) {
  if (tensor_) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", Quote(tensor_->name), ": a second header arrived (for ",
                     Quote(h.name()), "); send one header per stream"));
  }
  const std::string what = absl::StrCat("tensor ", Quote(h.name()));
  RETURN_IF_ERROR(CheckTensorName(h.name(), what));
  ASSIGN_OR_RETURN(TensorMeta meta, CheckedMeta(h.dtype(), std::span<const int64_t>(h.shape().data(), h.shape().size()), limits_.max_tensor_bytes, what));
  RETURN_IF_ERROR(store_.CheckFree(h.name(), h.overwrite(), tenant_));
  auto buffer = backend_.Allocate(meta.Bytes());
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(), absl::StrCat(what, ": ", buffer.status().message()));
  }
  uploader_ = backend_.NewUploader(*buffer);
  tensor_ = std::make_shared<StoredTensor>(StoredTensor{h.name(), std::move(meta), *std::move(buffer)});
  overwrite_ = h.overwrite();
  return absl::OkStatus();
}

absl::Status PutAssembly::OnChunk(const std::string& chunk) {
  if (!tensor_) return absl::InvalidArgumentError("the first PutTensor message must be the header");
  const uint64_t expected = tensor_->meta.Bytes();
  if (chunk.size() > expected - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", Quote(tensor_->name), ": received more than the ", expected, " bytes that ",
        tensor_->meta.DebugString(), " holds (", received_ + chunk.size(), " so far)"));
  }
  RETURN_IF_ERROR(uploader_->Append(chunk.data(), chunk.size()));
  received_ += chunk.size();
  return absl::OkStatus();
}

absl::Status PutAssembly::Commit(v1::TensorInfo* info,
                                 const std::function<absl::Status()>& still_wanted) {
  if (!tensor_) return absl::InvalidArgumentError("the upload ended before its header");
  if (received_ != tensor_->meta.Bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(tensor_->name), ": received ",
                                                   received_, " bytes, expected ",
                                                   tensor_->meta.Bytes(), " for ",
                                                   tensor_->meta.DebugString()));
  }
  RETURN_IF_ERROR(uploader_->Finish());
  RETURN_IF_ERROR(store_.InsertAll({tensor_}, {overwrite_}, tenant_, still_wanted));
  convert::TensorInfoToProto(*tensor_, backend_.device(), info);
  return absl::OkStatus();
}

}  // namespace opserve
