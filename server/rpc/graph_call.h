// One call that runs a graph on the device, from edge to edge: Execute (opserve.v1) and
// ModelInfer (the Open Inference Protocol) are both a GraphCall, and differ only in how their
// request becomes a Graph and how the result becomes their response. The steps, in the order
// they run:
//   Start    (gRPC thread)  authenticate, MakeGraph, plan it, queue it on the device
//   Launch   (a lane's launch thread) queue the plan's work: inputs in, kernels, staging
//   Complete (the lane's completion thread) wait for that work, outputs out, commit
//   Reply    (the completion thread, once the queue slot is free) Respond, finish
// A failure at any step goes straight to Finish with its status.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/executor.h"
#include "server/rpc/service.h"

namespace opserve {

class GraphCall : public grpc::ServerUnaryReactor {
 public:
  // `rpc` names the call in metrics and must outlive it (a literal).
  GraphCall(OpServeService& svc, grpc::CallbackServerContext* ctx, absl::string_view rpc);
  void Start();

 protected:
  // The request's graph for `tenant`. It may view the request and anything the call keeps until
  // OnDone (graph.h).
  virtual absl::StatusOr<Graph> MakeGraph(const std::string& tenant) = 0;
  // Fills the response from the result of a successful run; a failure fails the call.
  virtual absl::Status Respond(ExecuteResult result, double queue_us) = 0;
  // Empties the response of a failed call, then the total time goes into whichever is sent.
  virtual void ClearResponse() = 0;
  virtual void SetTotalUs(double us) {}
  // Called once the device is done with the request's memory (after its last kernel, when it
  // failed, or when no work was queued), before the response: what the graph viewed may go.
  virtual void ReleaseInputs() {}

  OpServeService& svc_;
  grpc::CallbackServerContext* const ctx_;

 private:
  DeviceWorker::Finisher Launch(ExecEnv& env);
  ExecuteOptions Options() const;
  DeviceWorker::Completion Done(const absl::Status& s);
  void Reply(const absl::Status& s);
  void Finish(const absl::Status& s);
  void OnDone() override;
  void Mark(RequestTrace::Stage stage) {
    if (trace_ != nullptr) trace_->Mark(stage);
  }

  const absl::string_view rpc_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::unique_ptr<Plan> plan_;
  LaunchState launch_;
  ExecuteResult result_;
  double queue_us_ = 0;
  RequestTrace::Record* const trace_;  // nullptr: not traced
};

}  // namespace opserve
