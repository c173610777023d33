#include "server/rpc/put_assembly.h"

#include "server/rpc/convert.h"

#include <algorithm>

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
  // Placement: the parts the bytes go to, each a row range on one device.
  if (h.shard()) {
    if (!h.device().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": a sharded put spreads over every device; set shard or device, not both"));
    }
    ASSIGN_OR_RETURN(parts_, engine_.ShardRows(meta, what));
  } else {
    ASSIGN_OR_RETURN(int d, h.device().empty() ? engine_.PlaceNew()
                                               : engine_.FindDevice(h.device(), what));
    parts_ = {{.device = d, .row_begin = 0, .rows = meta.rank() > 0 ? meta.shape[0] : 1}};
  }
  const uint64_t rows = meta.rank() > 0 ? static_cast<uint64_t>(meta.shape[0]) : 1;
  const uint64_t row_bytes = rows > 0 ? meta.Bytes() / rows : 0;
  for (TensorShard& p : parts_) {
    const uint64_t bytes = parts_.size() == 1 ? meta.Bytes() : row_bytes * p.rows;
    auto buffer = engine_.backend(p.device).Allocate(bytes);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat(what, " (", meta.DebugString(), ", ", bytes, " bytes",
                                       parts_.size() > 1 ? " in this shard" : "", ") on ",
                                       engine_.device_name(p.device), ": ", buffer.status().message()));
    }
    p.buffer = *std::move(buffer);
  }
  overwrite_ = h.overwrite();
  tensor_ = std::make_shared<StoredTensor>(StoredTensor{h.name(), std::move(meta), nullptr, parts_[0].device});
  if (h.shard()) {
    tensor_->shards = parts_;
    tensor_->device = -1;
  } else {
    tensor_->buffer = parts_[0].buffer;
  }
  if (h.has_shm()) {
    // The bytes are in a region: one copy per part, at the host link's speed from a registered one.
    const v1::SharedMemoryRef& shm = h.shm();
    const uint64_t total = tensor_->meta.Bytes();
    if (shm.byte_size() != total) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shm byte_size is ", shm.byte_size(),
                                                     ", the tensor ", tensor_->meta.DebugString(), " has ",
                                                     total, " bytes"));
    }
    if (regions_ == nullptr) return absl::UnimplementedError(absl::StrCat(what, ": no shared memory here"));
    auto r = ResolveRegion(*regions_, tenant_, shm.region(), shm.offset(), shm.byte_size());
    if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat(what, ": ", r.status().message()));
    uint64_t offset = 0;
    for (TensorShard& p : parts_) {
      const uint64_t bytes = p.buffer->bytes();
      if (bytes > 0) {
        RETURN_IF_ERROR(engine_.backend(p.device).CopyIn(
            *p.buffer, static_cast<const char*>(r->data()) + offset, bytes));
      }
      offset += bytes;
    }
    received_ = total;
    from_region_ = true;
    return absl::OkStatus();
  }
  for (TensorShard& p : parts_) uploaders_.push_back(engine_.backend(p.device).NewUploader(p.buffer));
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
  // The chunk's bytes go to the parts in row order; a chunk may span a shard boundary.
  const char* data = chunk.data();
  uint64_t left = chunk.size();
  while (left > 0) {
    while (part_ < parts_.size() && part_received_ == parts_[part_].buffer->bytes()) {
      ++part_;
      part_received_ = 0;
    }
    if (part_ >= parts_.size()) return absl::InternalError("upload parts out of step");
    const uint64_t n = std::min(left, parts_[part_].buffer->bytes() - part_received_);
    RETURN_IF_ERROR(uploaders_[part_]->Append(data, n));
    data += n;
    left -= n;
    part_received_ += n;
  }
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
  for (auto& u : uploaders_) RETURN_IF_ERROR(u->Finish());
  RETURN_IF_ERROR(store_.InsertAll({tensor_}, {overwrite_}, tenant_, still_wanted));
  convert::TensorInfoToProto(*tensor_, engine_.device_names(), info);
  return absl::OkStatus();
}

}  // namespace opserve
