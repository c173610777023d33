// What Execute (execute_call.cc) and ModelInfer (infer_call.cc) share at the edge: a gRPC
// reactor whose request runs a graph. Each call's own file reads top to bottom:
//   Start (the gRPC thread)  Admit; its protocol's conversion into a Graph; Engine::Submit
//   Done  (where the engine hands the request back, once: request.h)  its protocol's
//         conversion of the result into the response; what the graph viewed goes; Finish
// A failure before Submit goes straight to Finish with its status.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/request.h"
#include "server/rpc/server_core.h"

namespace opserve {

class GraphCall : public grpc::ServerUnaryReactor, public RequestClient {
 public:
  absl::Status CheckAlive() const override { return CheckCallAlive(ctx_); }

 protected:
  // `rpc` names the call in metrics and must outlive it (a literal).
  GraphCall(ServerCore& core, grpc::CallbackServerContext* ctx, absl::string_view rpc);

  // The caller's tenant, once the call may run a graph (ServerCore::Admit).
  absl::StatusOr<std::string> Admit() { return core_.Admit(ctx_); }
  // The call's graph as the engine's request, which comes back through Done.
  std::unique_ptr<Request> MakeRequest(std::string tenant, Graph graph) {
    return std::make_unique<Request>(rpc_, start_, trace_, *this, std::move(tenant),
                                     std::move(graph));
  }
  // Since the call arrived: its total time.
  double ElapsedUs() const;
  // Counts and traces the call, and finishes it with `s`: exactly once, after the response is
  // filled (or cleared) and what the graph viewed has gone.
  void Finish(const absl::Status& s);

  ServerCore& core_;
  grpc::CallbackServerContext* const ctx_;

 private:
  void OnDone() override;
  // OnDone only counts the call out and frees it, and OnCancel is the base class's no-op, so
  // gRPC may run them on whichever of its threads completes the call. Otherwise it hands every
  // call's OnDone to its executor: a thread woken per call, and a pool of up to two threads a
  // core competing for the cores under load. gRPC marks this hook as not part of its API; its
  // own default reactor uses it the same way.
  bool InternalInlineable() override { return true; }
  void Mark(RequestTrace::Stage stage) {
    if (trace_ != nullptr) trace_->Mark(stage);
  }

  const absl::string_view rpc_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  RequestTrace::Record* const trace_;  // nullptr: not traced
};

}  // namespace opserve
