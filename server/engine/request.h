// One request that runs a graph, owned by the engine from Submit to its one hand-back. The edge
// (Execute, ModelInfer) turns its message into a Graph, makes a Request of it and submits it
// (engine.h); it hears back once, through RequestClient::Done, with the request's status and
// result. In between, the request passes its stages in this order, each on the thread named:
//   received   (the edge's handler thread) made by the edge, its graph converted
//   planned    (the handler thread, Engine::Submit) checked and planned: the Plan
//   queued     (the handler thread) on the device's queue, alone or in a batch (batch.h)
//   launched   (a lane's launch thread, Launch) inputs in, kernels, staging queued: LaunchPlan
//   completed  (the lane's completion thread, Complete) one wait, outputs out, the commit:
//              CompletePlan; the plan and what it holds go
//   replied    (the same thread once the queue slot is free, Reply) RequestClient::Done
// A failure at any stage goes straight to the hand-back with its status.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/engine/collectives.h"
#include "server/engine/device_worker.h"
#include "server/engine/executor.h"
#include "server/engine/graph.h"
#include "server/engine/plan.h"
#include "server/engine/request_trace.h"

namespace opserve {

class Engine;
class Request;

// The edge's side of a request: whether its caller still wants the answer, and the one place
// the answer arrives.
class RequestClient {
 public:
  // OK while the caller waits; DEADLINE_EXCEEDED or CANCELLED once it does not. Asked as a lane
  // takes the request, before each node and at the commit.
  virtual absl::Status CheckAlive() const = 0;
  // The request is over: `request->status()` says how, and on success `request->result()` holds
  // what it returned. Called exactly once, when nothing on the device reads what the graph
  // viewed any more and the request's queue slot is free: on the handler's thread when it failed
  // before the queue, otherwise on a lane's completion thread (on its launch thread for the test
  // hook that replies there).
  virtual void Done(std::unique_ptr<Request> request) = 0;

 protected:
  ~RequestClient() = default;
};

class Request final : public DeviceJob {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Stage { kReceived, kPlanned, kQueued, kLaunched, kCompleted, kReplied };

  // `rpc` names the request in metrics (a literal that outlives it); `received` is when the edge
  // got it, the start of its queue time; `trace` records its timeline (nullptr: none). The graph
  // views the edge's message, which the edge keeps until Done.
  Request(absl::string_view rpc, Clock::time_point received, RequestTrace::Record* trace,
          RequestClient& client, std::string tenant, Graph graph);

  Stage stage() const { return stage_; }
  absl::string_view rpc() const { return rpc_; }
  const absl::Status& status() const { return status_; }
  // What the run returned; the edge moves it into its response.
  ExecuteResult& result() { return result_; }
  // From receipt to a lane taking the request.
  double queue_us() const { return queue_us_; }
  const Plan& plan() const { return plan_; }

  // The stages a lane runs (device_worker.h).
  bool Launch(ExecEnv& env) override;
  void Complete(ExecEnv& env) override;
  void Reply() override;

 private:
  friend class Engine;   // places, plans, queues and fails it
  friend class BatchJob;  // runs it with others as one plan
  friend class ShardedRun;  // runs it as one part of a request over a sharded tensor

  // A lane took it: its queue time recorded; whether its caller still wants it.
  absl::Status BeginLaunch();
  // Its run is over with `status` (and its result on success): the plan and what it held go,
  // so that nothing the graph viewed is read any more.
  void Finish(const absl::Status& status);
  // Places the outputs kept on another device than the run's, and commits them (Plan::commit).
  absl::Status CommitElsewhere();
  // Hands it back to the edge without a run: `status` failed it before the queue.
  static void Fail(std::unique_ptr<Request> request, const absl::Status& status);
  ExecuteOptions Options() const;
  void Mark(RequestTrace::Stage stage) {
    if (trace_ != nullptr) trace_->Mark(stage);
  }

  const absl::string_view rpc_;
  const Clock::time_point received_;
  RequestTrace::Record* const trace_;
  RequestClient& client_;
  Engine* engine_ = nullptr;  // set when submitted
  int device_ = -1;           // the engine's index of the device it runs on, once placed
  int pinned_device_ = -1;    // set by a sharded run: the shard's device
  Stage stage_ = Stage::kReceived;
  const std::string tenant_;
  Graph graph_;  // until planned
  Plan plan_;
  LaunchState launch_;
  ExecuteResult result_;
  absl::Status status_;
  double queue_us_ = 0;
  // Stored inputs copied here from other devices before the run (Engine::GatherInputs).
  uint64_t peer_bytes_ = 0;
  double peer_us_ = 0;
  // ... and those copied while it runs, each waited for when it finishes (declared after plan_:
  // destroyed first, so that no copy still writes when the plan's buffers go).
  struct Arriving {
    std::unique_ptr<ArrivingBroadcast> copy;
    int device = 0;
    uint64_t bytes = 0;
  };
  std::vector<Arriving> arriving_;
#if OPSERVE_TEST_HOOKS
  // Answered without running (the test hook EngineOptions::reply_without_device).
  bool unrun_ = false;
  bool unrun_on_launch_ = false;  // ... from the launch thread, its slot freed after the reply
  bool injected_fault_ = false;   // the run --test_fail_device makes fail
#endif
};

}  // namespace opserve
