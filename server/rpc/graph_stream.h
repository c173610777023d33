// A bidirectional stream of graph calls: opserve.v1 ExecuteStream (execute_call.cc) and the
// Open Inference Protocol's ModelStreamInfer (infer_call.cc). Each message read from the stream
// is one graph call, the very one its unary RPC runs (graph_call.h), whose GraphEnd is the
// stream: its answer joins a queue of answers written one at a time, in completion order.
//
// Bounded: at most `window` requests (ServiceOptions::stream_window) are unanswered at once, from
// their read to the end of their answer's write; while that many are, the stream reads no
// further message, so a client that sends faster than the server answers waits in gRPC's flow
// control rather than growing the server's memory.
//
// The stream ends once nothing is left: no read outstanding, no request unanswered, no write
// outstanding, and either the client half-closed (OK) or the call broke (a failed write or
// read: the client cancelled, or the server's drain cancelled every call at its grace
// deadline). Requests still running then see their call cancelled (CheckCallAlive) and are
// answered; answers that cannot be written any more are dropped. The stream counts as one of the
// core's active calls until gRPC is done with it, so that the drain waits for it.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "server/rpc/graph_call.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/request_parsing.h"
#include "server/rpc/server_core.h"

namespace opserve {

// `Traits` names the protocol's messages and what it adds to a call:
//   using In (the request message), Out (the stream's response), Call (the graph call);
//   static constexpr absl::string_view kRpc: the RPC's name in metrics;
//   void StartCall(std::optional<Call>&, ServerCore&, grpc::CallbackServerContext*,
//                         GraphEnd&, const ParsedRequest<In>&, Out*): makes the call, whose
//       response lies in Out, and starts it;
//   static void Answered(const ParsedRequest<In>&, const absl::Status&, Out*): the request's id
//       and, on failure, its status, into Out.
template <typename Traits>
class GraphStream final
    : public grpc::ServerBidiReactor<ParsedRequest<typename Traits::In>, typename Traits::Out> {
  using In = typename Traits::In;
  using Out = typename Traits::Out;
  using Call = typename Traits::Call;

 public:
  // `lift_path`: where each request's large bytes fields are received into the core's receive
  // pool (nullptr: nowhere, the ordinary parse).
  GraphStream(ServerCore& core, grpc::CallbackServerContext* ctx, const LiftPath* lift_path,
              Traits traits = {})
      : core_(core),
        ctx_(ctx),
        lift_path_(lift_path),
        traits_(std::move(traits)),
        window_(std::max(1, core.options().stream_window)) {
    core_.CallStarted();
    // A caller without a valid token is refused once, for the whole stream.
    if (absl::StatusOr<std::string> tenant = core_.Authenticate(ctx); !tenant.ok()) {
      core_.RecordRpc(Traits::kRpc, tenant.status(), std::chrono::steady_clock::now());
      finished_ = true;
      this->Finish(ToGrpcStatus(tenant.status()));
      return;
    }
    reading_ = true;
    next_ = NewItem();
    this->StartRead(&next_->parsed);
  }

 private:
  // One request of the stream: its message, its answer and its call.
  struct Item final : GraphEnd {
    explicit Item(GraphStream& s) : stream(s) {}
    void End(const absl::Status& s) override { stream.Answer(this, s); }
    GraphStream& stream;
    ParsedRequest<In> parsed;
    Out out;
    std::optional<Call> call;
  };

  std::unique_ptr<Item> NewItem() {
    auto item = std::make_unique<Item>(*this);
    if (lift_path_ != nullptr) {
      item->parsed.lift_pool = core_.receive_pool().get();
      item->parsed.lift_path = lift_path_;
    }
    return item;
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, or the call broke
      std::unique_lock lock(mu_);
      reading_ = false;
      reads_over_ = true;
      std::unique_ptr<Item> unread = std::move(next_);
      const bool finish = ShouldFinish();
      lock.unlock();
      unread.reset();
      if (finish) this->Finish(FinalStatus());
      return;
    }
    Item* item;
    {
      std::lock_guard lock(mu_);
      item = next_.release();
      ++unanswered_;
      core_.RecordStreamUnanswered(unanswered_);
    }
    TakeOverParsed(&item->parsed);
    // reading_ stays set until ReadIfRoom: the stream cannot end (and be freed) under this
    // thread while the request runs, which may answer it, and write, before Run returns.
    Run(item);
    ReadIfRoom(/*after_read=*/true);
  }

  // The request's graph call, or its refusal when it did not parse (counted as its RPC's
  // refusals are, without an id: its id is in the bytes that did not parse).
  void Run(Item* item) {
    if (!item->parsed.status.ok()) {
      Answer(item, core_.RefuseUnparsed(ctx_, Traits::kRpc, item->parsed.status));
      return;
    }
    traits_.StartCall(item->call, core_, ctx_, *item, item->parsed, &item->out);
  }

  // Reads the next request when the window has room and the stream still reads; ends the
  // stream when nothing is left. `after_read`: called by the read that just ended.
  void ReadIfRoom(bool after_read) {
    std::unique_lock lock(mu_);
    if (after_read) reading_ = false;
    if (reading_ || reads_over_ || broken_ || finished_) {
      const bool finish = ShouldFinish();
      lock.unlock();
      if (finish) this->Finish(FinalStatus());
      return;
    }
    if (unanswered_ >= window_) {
      if (!waiting_) core_.RecordStreamWindowFull();
      waiting_ = true;  // a write's end reads again
      return;
    }
    waiting_ = false;
    reading_ = true;
    next_ = NewItem();
    Item* next = next_.get();
    lock.unlock();
    this->StartRead(&next->parsed);
  }

  // The request's answer is ready (its call's GraphEnd): onto the write queue, or dropped once
  // the stream cannot be written any more. Frees nothing that the caller still uses: a call's
  // End is the last thing it does.
  void Answer(Item* item, const absl::Status& s) {
    Traits::Answered(item->parsed, s, &item->out);
    std::unique_lock lock(mu_);
    if (broken_) {
      --unanswered_;
      const bool finish = ShouldFinish();
      lock.unlock();
      Free(item);
      if (finish) this->Finish(FinalStatus());
      return;
    }
    ready_.push_back(item);
    if (writing_) return;
    writing_ = true;
    lock.unlock();
    this->StartWrite(&item->out);
  }

  void OnWriteDone(bool ok) override {
    std::vector<Item*> gone;
    Item* next = nullptr;
    bool more_behind = false;
    {
      std::lock_guard lock(mu_);
      gone.push_back(ready_.front());
      ready_.pop_front();
      --unanswered_;
      if (!ok) {  // the call broke: what waits to be written never will be
        broken_ = true;
        for (Item* i : ready_) gone.push_back(i);
        unanswered_ -= static_cast<int>(ready_.size());
        ready_.clear();
      }
      if (!ready_.empty()) {
        next = ready_.front();
        more_behind = ready_.size() > 1;
      } else {
        writing_ = false;
      }
    }
    for (Item* i : gone) Free(i);
    // With another answer queued behind it, this one may wait in gRPC's buffer for that one's
    // write (buffer_hint): answers that complete together leave in fewer frames and syscalls.
    // The last answer queued is always written without it, so nothing waits for a write that
    // never comes.
    if (next != nullptr) {
      this->StartWrite(&next->out,
                       more_behind ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
    }
    ReadIfRoom(/*after_read=*/false);
  }

  void Free(Item* item) {
    if (item->call.has_value()) item->call->MarkDone();
    delete item;
  }

  // Under mu_: whether the stream ends now (then exactly once).
  bool ShouldFinish() {
    if (finished_ || reading_ || writing_ || unanswered_ > 0) return false;
    if (!reads_over_ && !broken_) return false;
    finished_ = true;
    return true;
  }

  grpc::Status FinalStatus() const {
    if (broken_ || ctx_->IsCancelled()) return grpc::Status::CANCELLED;
    return grpc::Status::OK;
  }

  void OnDone() override {
    core_.CallDone();
    delete this;
  }

  ServerCore& core_;
  grpc::CallbackServerContext* const ctx_;
  const LiftPath* const lift_path_;
  const Traits traits_;
  const int window_;

  std::mutex mu_;
  std::unique_ptr<Item> next_;  // what the outstanding read reads into
  std::deque<Item*> ready_;     // answers to write; the front is being written
  int unanswered_ = 0;          // read, and not yet written or dropped
  bool reading_ = false;
  bool writing_ = false;
  bool waiting_ = false;     // reading stopped with the window full
  bool reads_over_ = false;  // a read failed: half-closed or broken
  bool broken_ = false;      // a write failed: the call is gone
  bool finished_ = false;
};

}  // namespace opserve
