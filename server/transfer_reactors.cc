// PutTensor and GetTensor: streaming reactors that move tensor bytes in chunks.
// A put holds its bytes in a budget-charged buffer that joins the store only once every byte
// arrived and the count matched the shape: a failed or abandoned upload leaves nothing behind.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/grpc_status.h"
#include "server/service.h"
#include "server/status_macros.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

// Smallest and largest chunk a client may ask GetTensor for.
constexpr uint32_t kMinChunkBytes = 4 << 10;
constexpr uint32_t kMaxChunkBytes = 64 << 20;

class PutReactor final : public grpc::ServerReadReactor<v1::PutTensorRequest> {
 public:
  PutReactor(OpServeService* svc, grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp)
      : svc_(svc), ctx_(ctx), resp_(resp) {
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, or the call broke
      Complete(ctx_->IsCancelled() ? absl::CancelledError("the client cancelled the upload")
                                   : Commit());
      return;
    }
    absl::Status s = msg_.kind_case() == v1::PutTensorRequest::kHeader ? OnHeader(msg_.header())
                                                                       : OnChunk(msg_.chunk());
    if (!s.ok()) {
      Complete(s);
      return;
    }
    StartRead(&msg_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status OnHeader(const v1::PutTensorHeader& h) {
    if (tensor_) return absl::InvalidArgumentError("a second header arrived; send one per stream");
    const std::string what = absl::StrCat("tensor '", h.name(), "'");
    RETURN_IF_ERROR(CheckTensorName(h.name(), what));
    ASSIGN_OR_RETURN(TensorMeta meta, MetaFromProto(h.dtype(), h.shape(),
                                                    svc_->options().limits.max_tensor_bytes, what));
    RETURN_IF_ERROR(svc_->store().CheckFree(h.name(), h.overwrite()));
    auto buffer = svc_->backend().Allocate(meta.Bytes());
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(), absl::StrCat(what, ": ", buffer.status().message()));
    }
    uploader_ = svc_->backend().NewUploader(*buffer);
    tensor_ = std::make_shared<StoredTensor>(StoredTensor{h.name(), std::move(meta), *std::move(buffer)});
    overwrite_ = h.overwrite();
    return absl::OkStatus();
  }

  absl::Status OnChunk(const std::string& chunk) {
    if (!tensor_) {
      return absl::InvalidArgumentError("the first PutTensor message must be the header");
    }
    const uint64_t expected = tensor_->meta.Bytes();
    if (chunk.size() > expected - received_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", tensor_->name, "': received more than the ", expected, " bytes that ",
          tensor_->meta.DebugString(), " holds (", received_ + chunk.size(), " so far)"));
    }
    RETURN_IF_ERROR(uploader_->Append(chunk.data(), chunk.size()));
    received_ += chunk.size();
    return absl::OkStatus();
  }

  absl::Status Commit() {
    if (!tensor_) return absl::InvalidArgumentError("the upload ended before its header");
    if (received_ != tensor_->meta.Bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor_->name, "': received ",
                                                     received_, " bytes, expected ",
                                                     tensor_->meta.Bytes(), " for ",
                                                     tensor_->meta.DebugString()));
    }
    RETURN_IF_ERROR(uploader_->Finish());
    RETURN_IF_ERROR(svc_->store().InsertAll({tensor_}, {overwrite_}));
    FillTensorInfo(*tensor_, svc_->backend().device(), resp_->mutable_info());
    return absl::OkStatus();
  }

  void Complete(absl::Status s) {
    resp_->set_seconds(std::chrono::duration<double>(Clock::now() - start_).count());
    if (s.ok() && svc_->metrics()) svc_->metrics()->RecordTransfer("upload", received_);
    // Whatever was not committed goes back to the pool and the budget now.
    uploader_.reset();
    tensor_.reset();
    svc_->UpdateStoreGauges();
    svc_->RecordRpc("PutTensor", s, start_);
    Finish(ToGrpcStatus(s));
  }

  OpServeService* svc_;
  grpc::CallbackServerContext* ctx_;
  v1::PutTensorResponse* resp_;
  const Clock::time_point start_ = Clock::now();
  v1::PutTensorRequest msg_;
  std::shared_ptr<StoredTensor> tensor_;
  std::unique_ptr<Uploader> uploader_;
  bool overwrite_ = false;
  uint64_t received_ = 0;
};

class GetReactor final : public grpc::ServerWriteReactor<v1::GetTensorResponse> {
 public:
  GetReactor(OpServeService* svc, const v1::GetTensorRequest* req) : svc_(svc) {
    auto t = svc_->store().Get(req->name());
    if (!t.ok()) {
      Complete(t.status());
      return;
    }
    tensor_ = *std::move(t);
    const uint32_t asked = req->chunk_bytes() ? req->chunk_bytes() : svc_->options().default_chunk_bytes;
    const uint64_t message_cap = svc_->options().limits.max_message_bytes / 2;
    chunk_bytes_ = std::clamp<uint64_t>(std::min<uint64_t>(asked, message_cap), kMinChunkBytes, kMaxChunkBytes);
    FillTensorInfo(*tensor_, svc_->backend().device(), msg_.mutable_info());
    StartWrite(&msg_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Complete(absl::CancelledError("the client went away during the download"));
      return;
    }
    const uint64_t total = tensor_->meta.Bytes();
    if (sent_ == total) {
      Complete(absl::OkStatus());
      return;
    }
    const uint64_t n = std::min(chunk_bytes_, total - sent_);
    std::string* chunk = msg_.mutable_chunk();
    chunk->resize(n);
    if (auto s = svc_->backend().CopyOut(*tensor_->buffer, sent_, chunk->data(), n); !s.ok()) {
      Complete(s);
      return;
    }
    sent_ += n;
    StartWrite(&msg_);
  }

  void OnDone() override { delete this; }

 private:
  void Complete(const absl::Status& s) {
    if (s.ok() && svc_->metrics()) svc_->metrics()->RecordTransfer("download", sent_);
    svc_->RecordRpc("GetTensor", s, start_);
    tensor_.reset();
    Finish(ToGrpcStatus(s));
  }

  OpServeService* svc_;
  const Clock::time_point start_ = Clock::now();
  StoredTensorPtr tensor_;
  v1::GetTensorResponse msg_;
  uint64_t chunk_bytes_ = 0;
  uint64_t sent_ = 0;
};

}  // namespace

grpc::ServerReadReactor<v1::PutTensorRequest>* OpServeService::PutTensor(
    grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp) {
  return new PutReactor(this, ctx, resp);
}

grpc::ServerWriteReactor<v1::GetTensorResponse>* OpServeService::GetTensor(
    grpc::CallbackServerContext*, const v1::GetTensorRequest* req) {
  return new GetReactor(this, req);
}

}  // namespace opserve
