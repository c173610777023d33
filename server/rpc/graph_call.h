// What Execute (execute_call.cc) and ModelInfer (infer_call.cc) share at the edge: one request
// that runs a graph. Each protocol's call reads top to bottom:
//   Start (the gRPC thread)  Admit; its protocol's conversion into a Graph; Engine::Submit
//   Done  (where the engine hands the request back, once: request.h)  its protocol's
//         conversion of the result into the response; what the graph viewed goes; Finish
// A failure before Submit goes straight to Finish with its status. Finish counts the request
// and hands its status to the call's GraphEnd: the unary RPC's reactor (UnaryGraphCall, which
// finishes the RPC) or a stream's (graph_stream.h, which writes the answer on the stream). The
// request's flow is the same either way.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/request.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/server_core.h"

namespace opserve {

// Where a graph call's answer goes once its response is filled (or cleared).
class GraphEnd {
 public:
  virtual void End(const absl::Status& s) = 0;

 protected:
  ~GraphEnd() = default;
};

class GraphCall : public RequestClient {
 public:
  absl::Status CheckAlive() const override { return CheckCallAlive(ctx_); }
  // The end of its timeline, once gRPC is done with what carried the answer.
  void MarkDone() { Mark(RequestTrace::kDone); }

 protected:
  // `rpc` names the call in metrics and must outlive it (a literal). `ctx` is the RPC's (a
  // stream's for each of its requests); `end` outlives the call.
  GraphCall(ServerCore& core, grpc::CallbackServerContext* ctx, absl::string_view rpc,
            GraphEnd& end);

  // The caller's tenant, once the call may run a graph (ServerCore::Admit).
  absl::StatusOr<std::string> Admit() { return core_.Admit(ctx_); }
  // The call's graph as the engine's request, which comes back through Done.
  std::unique_ptr<Request> MakeRequest(std::string tenant, Graph graph) {
    return std::make_unique<Request>(rpc_, start_, trace_, *this, std::move(tenant),
                                     std::move(graph));
  }
  // Since the call arrived: its total time.
  double ElapsedUs() const;
  // Counts and traces the call, and hands `s` to its end: exactly once, after the response is
  // filled (or cleared) and what the graph viewed has gone.
  void Finish(const absl::Status& s);

  ServerCore& core_;
  grpc::CallbackServerContext* const ctx_;

 private:
  void Mark(RequestTrace::Stage stage) {
    if (trace_ != nullptr) trace_->Mark(stage);
  }

  GraphEnd& end_;
  const absl::string_view rpc_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  RequestTrace::Record* const trace_;  // nullptr: not traced
};

// A unary RPC whose request is one graph call `Call` (made from `args` after the core, the
// context and its end): the call's End finishes the RPC. Counts itself among the core's active
// calls until gRPC is done with it (the response sent), so that the drain on SIGTERM waits for it.
template <typename Call>
class UnaryGraphCall final : public grpc::ServerUnaryReactor, public GraphEnd {
 public:
  template <typename... Args>
  static grpc::ServerUnaryReactor* Start(ServerCore& core, grpc::CallbackServerContext* ctx,
                                         Args&&... args) {
    auto* reactor = new UnaryGraphCall(core, ctx, std::forward<Args>(args)...);
    reactor->call_.Start();
    return reactor;
  }

 private:
  template <typename... Args>
  UnaryGraphCall(ServerCore& core, grpc::CallbackServerContext* ctx, Args&&... args)
      : core_((core.CallStarted(), core)), call_(core, ctx, *this, std::forward<Args>(args)...) {}

  void End(const absl::Status& s) override { grpc::ServerUnaryReactor::Finish(ToGrpcStatus(s)); }
  void OnDone() override {
    call_.MarkDone();
    core_.CallDone();
    delete this;
  }
  // OnDone only counts the call out and frees it, and OnCancel is the base class's no-op, so
  // gRPC may run them on whichever of its threads completes the call. Otherwise it hands every
  // call's OnDone to its executor: a thread woken per call, and a pool of up to two threads a
  // core competing for the cores under load. gRPC marks this hook as not part of its API; its
  // own default reactor uses it the same way.
  bool InternalInlineable() override { return true; }

  ServerCore& core_;
  Call call_;
};

}  // namespace opserve
