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
  overwrite_ = h.overwrite();
  if (h.has_shm()) {
    // The bytes are in a region: one copy, at the host link's speed from a registered one.
    const v1::SharedMemoryRef& shm = h.shm();
    if (shm.byte_size() != meta.Bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shm byte_size is ", shm.byte_size(),
                                                     ", the tensor ", meta.DebugString(), " has ",
                                                     meta.Bytes(), " bytes"));
    }
    if (regions_ == nullptr) return absl::UnimplementedError(absl::StrCat(what, ": no shared memory here"));
    auto r = ResolveRegion(*regions_, tenant_, shm.region(), shm.offset(), shm.byte_size());
    if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat(what, ": ", r.status().message()));
    if (meta.Bytes() > 0) RETURN_IF_ERROR(backend_.CopyIn(**buffer, r->data(), meta.Bytes()));
    received_ = meta.Bytes();
    from_region_ = true;
    tensor_ = std::make_shared<StoredTensor>(StoredTensor{h.name(), std::move(meta), *std::move(buffer)});
    return absl::OkStatus();
  }
  uploader_ = backend_.NewUploader(*buffer);
  tensor_ = std::make_shared<StoredTensor>(StoredTensor{h.name(), std::move(meta), *std::move(buffer)});
  return absl::OkStatus();
}

absl::Status PutAssembly::OnChunk(const std::string& chunk) {
  if (!tensor_) return absl::InvalidArgumentError("the first PutTensor message must be the header");
  if (from_region_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", Quote(tensor_->name), ": its header names a shared memory region, so no chunk may follow"));
  }
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
  if (uploader_) RETURN_IF_ERROR(uploader_->Finish());
  RETURN_IF_ERROR(store_.InsertAll({tensor_}, {overwrite_}, tenant_, still_wanted));
  convert::TensorInfoToProto(*tensor_, backend_.device(), info);
  return absl::OkStatus();
}

}  // namespace opserve
