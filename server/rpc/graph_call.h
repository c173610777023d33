// One call that runs a graph on the device, from edge to edge: Execute (opserve.v1) and
// ModelInfer (the Open Inference Protocol) are both a GraphCall, and differ only in how their
// request becomes a Graph and how the result becomes their response. The steps, in the order
// they run:
//   Start    (gRPC thread)  authenticate, MakeGraph, plan it, queue it on the device
//   Launch   (a lane's launch thread) queue the plan's work: inputs in, kernels, staging
//   Complete (the lane's completion thread) wait for that work, outputs out, commit
//   Reply    (the completion thread, once the queue slot is free) Respond, finish
// A failure at any step goes straight to Finish with its status. With --max_batch_size, calls
// of one plan signature that wait for a lane together launch and complete as one plan
// (LaunchBatch; graph_batcher.h), each still replying on its own.
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
  // Marks the call taken by a lane and records its queue time; whether it is still wanted.
  absl::Status BeginLaunch();
  // Queues the call in its signature's open batch, or opens one and queues that on the device.
  void JoinBatch();
  // The lane's half of a batch of calls: closes it, launches the members still wanted as one
  // plan, and returns the finisher that completes them all.
  static DeviceWorker::Finisher LaunchBatch(OpServeService& svc, const std::string& key,
                                            const std::shared_ptr<GraphBatch>& batch,
                                            ExecEnv& env);
  ExecuteOptions Options() const;
  // Whether the test hook ServiceOptions::reply_without_device may answer this plan unrun: its
  // outputs all go into the response.
  bool MayAnswerUnrun() const;
  DeviceWorker::Completion Done(const absl::Status& s);
  void Reply(const absl::Status& s);
  void Finish(const absl::Status& s);
  void OnDone() override;
  // OnDone only counts the call out and frees it, and OnCancel is the base class's no-op, so
  // gRPC may run them on whichever of its threads completes the call. Otherwise it hands every
  // call's OnDone to its executor: a thread woken per call, and a pool of up to two threads a core
  // competing for the cores under load (PERFORMANCE.md, issue 14). gRPC marks this hook as not
  // part of its API; its own default reactor uses it the same way.
  bool InternalInlineable() override { return true; }
  void Mark(RequestTrace::Stage stage) {
    if (trace_ != nullptr) trace_->Mark(stage);
  }

  const absl::string_view rpc_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::unique_ptr<Plan> plan_;
  LaunchState launch_;
  ExecuteResult result_;
  bool unrun_ = false;  // answered without running (ServiceOptions::reply_without_device)
  bool unrun_on_launch_ = false;  // ... on the launch thread, without a finisher
  double queue_us_ = 0;
  RequestTrace::Record* const trace_;  // nullptr: not traced
};

}  // namespace opserve
