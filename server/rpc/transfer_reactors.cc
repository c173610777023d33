// PutTensor and GetTensor: streaming reactors that move tensor bytes in chunks. A put's bytes
// are assembled by PutAssembly, which commits only a complete tensor. A put's messages arrive
// as ParsedRequest (server/request_parsing.h): one that does not parse fails the upload with
// INVALID_ARGUMENT rather than reading as the end of the stream.
//
// Neither reactor waits on the device on a gRPC thread: every step that may (staging a chunk,
// a device-to-host copy, the upload's final wait, freeing an upload) runs on the service's
// TransferPool. Each reactor double-buffers its messages, so the step on one chunk overlaps the
// network on the next: an upload reads chunk i+1 while chunk i is copied to the GPU, a download
// copies chunk i+1 from the GPU while chunk i is being sent. A small state machine under a mutex
// decides the next reads, writes and steps; gRPC operations are started outside the mutex.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/put_assembly.h"
#include "server/rpc/convert.h"
#include "server/rpc/service.h"
#include "common/status_macros.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

// Smallest and largest chunk a client may ask GetTensor for.
constexpr uint32_t kMinChunkBytes = 4 << 10;
constexpr uint32_t kMaxChunkBytes = 64 << 20;

class PutReactor final : public grpc::ServerReadReactor<ParsedStreamMessage<v1::PutTensorRequest>> {
 public:
  PutReactor(ServerCore* svc, grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp)
      : svc_(svc), ctx_(ctx), resp_(resp) {
    svc_->CallStarted();
    auto tenant = svc_->Authenticate(ctx);
    if (!tenant.ok()) {
      finished_ = true;
      Complete(tenant.status());
      return;
    }
    assembly_.emplace(svc_->engine(), svc_->options().limits, *tenant,
                      &svc_->regions());
    Do(Locked([&] { return Step(); }));
  }

  void OnReadDone(bool ok) override {
    Do(Locked([&] {
      reading_ = false;
      TakeOverParsed(&msgs_[reading_idx_]);
      if (ok && !msgs_[reading_idx_].status.ok()) {
        // Not an end of stream: an upload whose last message does not parse is not complete.
        const absl::Status& s = msgs_[reading_idx_].status;
        error_ = absl::Status(s.code(), absl::StrCat("PutTensor: message ", messages_read_ + 1,
                                                     " of the stream: ", s.message()));
      } else if (ok) {
        ++messages_read_;
        pending_ = reading_idx_;
      } else {  // the client half-closed, or the call broke
        eof_ = true;
        cancelled_ = ctx_->IsCancelled();
      }
      return Step();
    }));
  }

  void OnDone() override {
    svc_->CallDone();
    delete this;
  }

 private:
  // What Step decided; carried out by Do, outside the mutex.
  struct Actions {
    int read = -1;     // StartRead into msgs_[read]
    int process = -1;  // post OnMessage(msgs_[process])
    bool commit = false;
    std::optional<absl::Status> finish;
  };

  template <typename F>
  Actions Locked(F f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f();
  }

  // Under mu_. At most one step and one read at a time, over two messages.
  Actions Step() {
    Actions a;
    if (finished_) return a;
    if (!error_.ok() || (eof_ && cancelled_)) {
      if (!processing_) {  // a read may still be outstanding: Finish ends it
        finished_ = true;
        a.finish = error_.ok() ? absl::CancelledError("the client cancelled the upload") : error_;
      }
      return a;
    }
    if (!processing_ && pending_ >= 0) {
      processing_ = true;
      processing_idx_ = a.process = pending_;
      pending_ = -1;
    }
    if (eof_) {
      if (!processing_ && pending_ < 0) {
        processing_ = true;
        a.commit = true;
      }
      return a;
    }
    if (!reading_ && pending_ < 0) {
      reading_ = true;
      reading_idx_ = a.read = (processing_ && processing_idx_ == 0) ? 1 : 0;
    }
    return a;
  }

  // The read starts before any step is posted: a step may end the call (through Step), and
  // must not be able to before this thread is done with the reactor.
  void Do(const Actions& a) {
    if (a.read >= 0) StartRead(&msgs_[a.read]);
    if (a.process >= 0) {
      svc_->transfers().Post([this, idx = a.process] {
        absl::Status s = assembly_->OnMessage(msgs_[idx].message);
        msgs_[idx].message.Clear();
        Do(Locked([&] {
          processing_ = false;
          if (!s.ok()) error_ = s;
          return Step();
        }));
      });
    }
    if (a.commit) {
      svc_->transfers().Post([this] {
        // An upload whose client cancelled after half-closing, or whose deadline passed, stores
        // nothing: the check runs under the store's lock, at the insert itself.
        absl::Status s =
            assembly_->Commit(resp_->mutable_info(), [this] { return CheckCallAlive(ctx_); });
        Locked([&] {
          processing_ = false;
          finished_ = true;
          return Actions{};
        });
        Complete(s);
      });
    }
    if (a.finish) {
      // Dropping an unfinished upload waits for its copies: not on a gRPC thread.
      svc_->transfers().Post([this, s = *a.finish] { Complete(s); });
    }
  }

  // Once, with no step running.
  void Complete(const absl::Status& s) {
    resp_->set_seconds(std::chrono::duration<double>(Clock::now() - start_).count());
    if (s.ok() && svc_->metrics()) svc_->metrics()->RecordTransfer("upload", assembly_->received());
    // Whatever was not committed goes back to the pool and the budget now.
    assembly_.reset();
    svc_->UpdateStoreGauges();
    svc_->RecordRpc("PutTensor", s, start_);
    Finish(ToGrpcStatus(s));
  }

  ServerCore* svc_;
  grpc::CallbackServerContext* ctx_;
  v1::PutTensorResponse* resp_;
  const Clock::time_point start_ = Clock::now();
  ParsedStreamMessage<v1::PutTensorRequest> msgs_[2];
  std::optional<PutAssembly> assembly_;

  std::mutex mu_;
  bool reading_ = false;
  int reading_idx_ = -1;
  int pending_ = -1;  // a message read and not yet processed
  int messages_read_ = 0;  // that parsed
  bool processing_ = false;
  int processing_idx_ = -1;
  bool eof_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
  absl::Status error_;
};

class GetReactor final : public grpc::ServerWriteReactor<v1::GetTensorResponse> {
 public:
  GetReactor(ServerCore* svc, grpc::CallbackServerContext* ctx, const v1::GetTensorRequest* req)
      : svc_(svc) {
    svc_->CallStarted();
    auto tenant = svc_->Authenticate(ctx);
    auto t = tenant.ok() ? svc_->store().Get(req->name(), *tenant) : tenant.status();
    if (t.ok()) {
      if (absl::Status readable = svc_->engine().Readable(**t); !readable.ok()) t = readable;
    }
    if (!t.ok()) {
      finished_ = true;
      Complete(t.status());
      return;
    }
    tensor_ = *std::move(t);
    total_ = tensor_->meta.Bytes();
    const uint32_t asked = req->chunk_bytes() ? req->chunk_bytes() : svc_->options().default_chunk_bytes;
    const uint64_t message_cap = svc_->options().limits.max_message_bytes / 2;
    // Within [kMinChunkBytes, kMaxChunkBytes], and never over what one message may carry.
    chunk_bytes_ = std::max<uint64_t>(
        1, std::min<uint64_t>(std::clamp<uint64_t>(asked, kMinChunkBytes, kMaxChunkBytes), message_cap));
    convert::TensorInfoToProto(*tensor_, svc_->engine().device_names(), info_.mutable_info());
    if (req->has_shm()) {
      // Into the client's region, off the gRPC thread; then the info message alone.
      const v1::SharedMemoryRef& shm = req->shm();
      absl::StatusOr<RegionRange> r =
          shm.byte_size() < total_
              ? absl::InvalidArgumentError(absl::StrCat(
                    "tensor ", Quote(req->name()), ": shm byte_size is ", shm.byte_size(),
                    ", the tensor ", tensor_->meta.DebugString(), " has ", total_, " bytes"))
              : ResolveRegion(svc_->regions(), *tenant, shm.region(), shm.offset(), total_);
      if (!r.ok()) {
        finished_ = true;
        Complete(absl::Status(r.status().code(),
                              absl::StrCat("tensor ", Quote(req->name()), ": ", r.status().message())));
        return;
      }
      svc_->transfers().Post([this, region = *std::move(r), bytes = total_]() mutable {
        absl::Status s = bytes == 0 ? absl::OkStatus()
                                    : svc_->engine().CopyOut(*tensor_, 0, region.mutable_data(), bytes);
        // The region is free before the client can hear back: a client that unregisters it
        // right after the call (tritonclient's order) must not find it still in use.
        region = RegionRange();
        if (!s.ok()) {
          Locked([&] {
            finished_ = true;
            return Actions{};
          });
          Complete(s);
          return;
        }
        Locked([&] {
          total_ = 0;  // nothing left to stream
          return Actions{};
        });
        WriteInfo();
      });
      return;
    }
    WriteInfo();
  }

  // The first message; the chunks follow as Step posts their copies.
  void WriteInfo() {
    Do(Locked([&] {
      writing_ = true;
      Actions a = Step();
      a.write_info = true;
      return a;
    }));
  }

  void OnWriteDone(bool ok) override {
    Do(Locked([&] {
      writing_ = false;
      writing_idx_ = -1;
      if (!ok) gone_ = true;
      return Step();
    }));
  }

  void OnDone() override {
    svc_->CallDone();
    delete this;
  }

 private:
  struct Actions {
    bool write_info = false;
    int write = -1;  // StartWrite(&msgs_[write])
    int fill = -1;   // post the copy of [fill_offset, +fill_bytes) into msgs_[fill]
    uint64_t fill_offset = 0;
    uint64_t fill_bytes = 0;
    std::optional<absl::Status> finish;
  };

  template <typename F>
  Actions Locked(F f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f();
  }

  // Under mu_. One write and one copy at a time, over two messages.
  Actions Step() {
    Actions a;
    if (finished_) return a;
    if (!error_.ok() || gone_) {
      if (!writing_ && !filling_) {
        finished_ = true;
        a.finish = gone_ ? absl::CancelledError("the client went away during the download") : error_;
      }
      return a;
    }
    if (!writing_ && ready_ >= 0) {
      writing_ = true;
      writing_idx_ = a.write = ready_;
      ready_ = -1;
    }
    if (!filling_ && ready_ < 0 && filled_ < total_) {
      filling_ = true;
      a.fill = writing_idx_ == 0 ? 1 : 0;
      a.fill_offset = filled_;
      a.fill_bytes = std::min(chunk_bytes_, total_ - filled_);
      filled_ += a.fill_bytes;
    }
    if (!writing_ && !filling_ && ready_ < 0 && filled_ == total_) {
      finished_ = true;
      a.finish = absl::OkStatus();
    }
    return a;
  }

  // Writes start before a copy is posted, as in PutReactor::Do (a posted copy cannot end the
  // call while filling_ is set, but this order does not need that argument).
  void Do(const Actions& a) {
    if (a.write_info) StartWrite(&info_);
    if (a.write >= 0) StartWrite(&msgs_[a.write]);
    if (a.fill >= 0) {
      svc_->transfers().Post([this, a] {
        std::string* chunk = msgs_[a.fill].mutable_chunk();
        chunk->resize(a.fill_bytes);
        absl::Status s = svc_->engine().CopyOut(*tensor_, a.fill_offset, chunk->data(), a.fill_bytes);
        Do(Locked([&] {
          filling_ = false;
          if (s.ok()) {
            ready_ = a.fill;
          } else {
            error_ = s;
          }
          return Step();
        }));
      });
    }
    // Dropping the last reference to a deleted tensor frees device memory: not on a gRPC thread.
    if (a.finish) svc_->transfers().Post([this, s = *a.finish] { Complete(s); });
  }

  // Once, with no copy running and no write outstanding.
  void Complete(const absl::Status& s) {
    if (s.ok() && svc_->metrics()) svc_->metrics()->RecordTransfer("download", total_);
    svc_->RecordRpc("GetTensor", s, start_);
    tensor_.reset();  // may be the last reference to a tensor deleted meanwhile
    svc_->UpdateStoreGauges();
    Finish(ToGrpcStatus(s));
  }

  ServerCore* svc_;
  const Clock::time_point start_ = Clock::now();
  StoredTensorPtr tensor_;
  uint64_t total_ = 0;
  uint64_t chunk_bytes_ = 0;
  v1::GetTensorResponse info_;
  v1::GetTensorResponse msgs_[2];

  std::mutex mu_;
  bool writing_ = false;
  int writing_idx_ = -1;  // -1 while the info message is being written
  bool filling_ = false;
  int ready_ = -1;  // a filled message not yet written
  uint64_t filled_ = 0;
  bool gone_ = false;
  bool finished_ = false;
  absl::Status error_;
};

}  // namespace

grpc::ServerReadReactor<ParsedStreamMessage<v1::PutTensorRequest>>* OpServeService::StartPutTensor(
    grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp) {
  return new PutReactor(&core_, ctx, resp);
}

grpc::ServerWriteReactor<v1::GetTensorResponse>* OpServeService::GetTensor(
    grpc::CallbackServerContext* ctx, const v1::GetTensorRequest* req) {
  return new GetReactor(&core_, ctx, req);
}

}  // namespace opserve
