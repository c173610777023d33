// PutTensor and GetTensor: streaming reactors that move tensor bytes in chunks. A put's bytes
// are assembled by PutAssembly, which commits only a complete tensor.
#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/grpc_status.h"
#include "server/put_assembly.h"
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
    auto ns = svc_->Authenticate(ctx);
    if (!ns.ok()) {
      Complete(ns.status());
      return;
    }
    assembly_.emplace(svc_->backend(), svc_->store(), svc_->options().limits, *ns);
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, or the call broke
      Complete(ctx_->IsCancelled() ? absl::CancelledError("the client cancelled the upload")
                                   : assembly_->Commit(resp_->mutable_info()));
      return;
    }
    if (absl::Status s = assembly_->OnMessage(msg_); !s.ok()) {
      Complete(s);
      return;
    }
    StartRead(&msg_);
  }

  void OnDone() override { delete this; }

 private:
  void Complete(const absl::Status& s) {
    resp_->set_seconds(std::chrono::duration<double>(Clock::now() - start_).count());
    if (s.ok() && svc_->metrics()) svc_->metrics()->RecordTransfer("upload", assembly_->received());
    // Whatever was not committed goes back to the pool and the budget now.
    assembly_.reset();
    svc_->UpdateStoreGauges();
    svc_->RecordRpc("PutTensor", s, start_);
    Finish(ToGrpcStatus(s));
  }

  OpServeService* svc_;
  grpc::CallbackServerContext* ctx_;
  v1::PutTensorResponse* resp_;
  const Clock::time_point start_ = Clock::now();
  v1::PutTensorRequest msg_;
  std::optional<PutAssembly> assembly_;
};

class GetReactor final : public grpc::ServerWriteReactor<v1::GetTensorResponse> {
 public:
  GetReactor(OpServeService* svc, grpc::CallbackServerContext* ctx, const v1::GetTensorRequest* req)
      : svc_(svc) {
    auto ns = svc_->Authenticate(ctx);
    if (!ns.ok()) {
      Complete(ns.status());
      return;
    }
    auto t = svc_->store().Get(req->name(), *ns);
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
    tensor_.reset();  // may be the last reference to a tensor deleted meanwhile
    svc_->UpdateStoreGauges();
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
    grpc::CallbackServerContext* ctx, const v1::GetTensorRequest* req) {
  return new GetReactor(this, ctx, req);
}

}  // namespace opserve
