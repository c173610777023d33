#include "server/rpc/graph_call.h"

#include "absl/strings/str_cat.h"
#include "server/engine/batch.h"
#include "server/rpc/grpc_status.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

#if OPSERVE_TEST_HOOKS
// What a plan would report and return, without running it (ServiceOptions::reply_without_device).
// Only for plans whose outputs all go into the response (GraphCall::MayAnswerUnrun).
ExecuteResult UnrunResult(const Plan& plan) {
  ExecuteResult r;
  r.device = "none";
  for (const PlanNode& n : plan.nodes) {
    r.nodes.push_back({.id = n.id, .op = n.op->name, .algorithm = n.algo->name, .output = n.output,
                       .cost = n.cost});
    if (n.returned) {
      r.outputs.push_back({.node = n.id, .meta = n.output, .data = std::string(n.output.Bytes(), '\0')});
    }
  }
  return r;
}
#endif

}  // namespace

// Counts itself among the service's active calls until gRPC is done with it (the response
// sent), so that the drain on SIGTERM waits for it.
GraphCall::GraphCall(OpServeService& svc, grpc::CallbackServerContext* ctx, absl::string_view rpc)
    : svc_(svc),
      ctx_(ctx),
      rpc_(rpc),
      trace_(svc.options().trace != nullptr ? svc.options().trace->Add(rpc) : nullptr) {
  Mark(RequestTrace::kReceived);
  svc_.CallStarted();
  if (svc_.metrics() != nullptr) svc_.metrics()->AddInflight(1);
}

void GraphCall::Start() {
  auto tenant = svc_.Authenticate(ctx_);
  if (!tenant.ok()) return Finish(tenant.status());
  if (absl::Status healthy = svc_.backend().Healthy(); !healthy.ok()) {
    svc_.ReportUnhealthy();  // a transfer may have seen the failure first
    return Finish(healthy);
  }
  // A call that is already dead (its deadline passed in transit) neither plans nor queues.
  if (absl::Status alive = CheckCallAlive(ctx_); !alive.ok()) return Finish(alive);
  auto graph = MakeGraph(*tenant);
  if (!graph.ok()) return Finish(graph.status());
  auto plan = BuildPlan(*graph, svc_.backend(), svc_.store(), svc_.options().limits, *tenant);
  if (!plan.ok()) return Finish(plan.status());
  plan_ = std::make_unique<Plan>(*std::move(plan));
  Mark(RequestTrace::kPlanned);
#if OPSERVE_TEST_HOOKS
  if (const std::string& mode = svc_.options().reply_without_device; !mode.empty() && MayAnswerUnrun()) {
    result_ = UnrunResult(*plan_);
    unrun_ = true;
    unrun_on_launch_ = mode == "launch";
    if (mode == "handler") return Done(absl::OkStatus())();
  }
#endif
  if (!unrun_ && svc_.batcher().max_size() > 1 && Batchable(*plan_)) return JoinBatch();
  absl::Status queued = svc_.device().SubmitAsync([this](ExecEnv& env) { return Launch(env); });
  if (!queued.ok()) Finish(queued);
}

void GraphCall::JoinBatch() {
  GraphBatcher& b = svc_.batcher();
  std::string key = absl::StrCat(plan_->tenant.size(), ":", plan_->tenant, plan_->signature);
  absl::Status queued;
  {
    std::lock_guard<std::mutex> lock(b.mu_);
    auto it = b.open_.find(key);
    if (it != b.open_.end() && static_cast<int>(it->second->members.size()) < b.max_size()) {
      it->second->members.push_back(this);
      return;
    }
    auto batch = std::make_shared<GraphBatch>();
    batch->members.push_back(this);
    // Under the lock: no call joins a batch whose job was refused.
    queued = svc_.device().SubmitAsync([svc = &svc_, key, batch](ExecEnv& env) {
      return LaunchBatch(*svc, key, batch, env);
    });
    if (queued.ok()) b.open_[key] = std::move(batch);  // a full batch of the key stays queued
  }
  if (!queued.ok()) Finish(queued);
}

DeviceWorker::Finisher GraphCall::LaunchBatch(OpServeService& svc, const std::string& key,
                                              const std::shared_ptr<GraphBatch>& batch,
                                              ExecEnv& env) {
  {
    std::lock_guard<std::mutex> lock(svc.batcher().mu_);
    auto it = svc.batcher().open_.find(key);
    if (it != svc.batcher().open_.end() && it->second == batch) svc.batcher().open_.erase(it);
  }
  if (batch->members.size() == 1) return batch->members.front()->Launch(env);

  // What the members share until their replies: the merged plan and its run.
  struct Run {
    // Each member's deadline is checked as the lane takes the batch; the run as a whole has none.
    ExecuteOptions options;
    std::vector<GraphCall*> live;
    std::vector<const Plan*> plans;
    Plan merged;
    LaunchState launch;
    ExecuteResult result;
    absl::Status launched;
  };
  auto run = std::make_shared<Run>();
#if OPSERVE_TEST_HOOKS
  run->options.fail_algorithm = svc.options().fail_algorithm;
#endif
  std::vector<std::pair<GraphCall*, absl::Status>> gone;  // deadline passed or cancelled
  for (GraphCall* m : batch->members) {
    if (absl::Status s = m->BeginLaunch(); !s.ok()) {
      gone.emplace_back(m, s);
      continue;
    }
    run->live.push_back(m);
    run->plans.push_back(m->plan_.get());
  }
  if (!run->live.empty()) {
    run->merged = MergePlans(run->plans);
    run->launched =
        LaunchPlan(run->merged, env, svc.metrics(), run->options, &run->launch, &run->result);
  }
  for (GraphCall* m : run->live) m->Mark(RequestTrace::kLaunchEnd);
  return [&svc, run, gone = std::move(gone)](ExecEnv& env) -> DeviceWorker::Completion {
    std::vector<DeviceWorker::Completion> replies;
    for (const auto& [m, s] : gone) replies.push_back(m->Done(s));
    absl::Status s = run->launched;
    if (s.ok() && !run->live.empty()) {
      for (GraphCall* m : run->live) m->Mark(RequestTrace::kWaitBegin);
      s = CompletePlan(run->merged, svc.backend(), env, svc.store(), svc.metrics(), run->options,
                       run->launch, &run->result);
    }
    if (s.ok()) {
      std::vector<ExecuteResult> parts = SplitResult(std::move(run->result), run->plans);
      for (size_t i = 0; i < run->live.size(); ++i) run->live[i]->result_ = std::move(parts[i]);
    }
    // The merged plan's buffers and stored inputs go before the members' replies (Done).
    run->launch = LaunchState();
    run->merged = Plan();
    run->plans.clear();
    for (GraphCall* m : run->live) replies.push_back(m->Done(s));
    return [replies = std::move(replies)] {
      for (const DeviceWorker::Completion& reply : replies) reply();
    };
  };
}

absl::Status GraphCall::BeginLaunch() {
  Mark(RequestTrace::kLaunchBegin);
  queue_us_ = MicrosSince(start_);
  if (svc_.metrics() != nullptr) {
    svc_.metrics()->RecordQueue(std::string_view(rpc_.data(), rpc_.size()), queue_us_ * 1e-6);
  }
  return CheckCallAlive(ctx_);
}

DeviceWorker::Finisher GraphCall::Launch(ExecEnv& env) {
  absl::Status s = BeginLaunch();
#if OPSERVE_TEST_HOOKS
  if (s.ok() && unrun_) {
    if (unrun_on_launch_) {
      // Replied before the job's slot is free: the next call may find the queue one fuller.
      Done(absl::OkStatus())();
      return nullptr;
    }
    return [this](ExecEnv&) { return Done(absl::OkStatus()); };
  }
#endif
  if (s.ok()) s = LaunchPlan(*plan_, env, svc_.metrics(), Options(), &launch_, &result_);
  Mark(RequestTrace::kLaunchEnd);
  if (!s.ok()) return [this, s](ExecEnv&) { return Done(s); };
  return [this](ExecEnv& env) {
    Mark(RequestTrace::kWaitBegin);
    return Done(CompletePlan(*plan_, svc_.backend(), env, svc_.store(), svc_.metrics(), Options(),
                             launch_, &result_));
  };
}

#if OPSERVE_TEST_HOOKS
bool GraphCall::MayAnswerUnrun() const {
  for (const PlanNode& n : plan_->nodes) {
    // Outputs the client would look for elsewhere: in the store, or in a shared-memory region.
    if (!n.store_as.empty() || n.host_dest != nullptr || n.device_dest != nullptr) return false;
  }
  return true;
}
#endif

ExecuteOptions GraphCall::Options() const {
  return {.check_alive = [ctx = ctx_] { return CheckCallAlive(ctx); },
#if OPSERVE_TEST_HOOKS
          .fail_algorithm = svc_.options().fail_algorithm
#endif
  };
}

DeviceWorker::Completion GraphCall::Done(const absl::Status& s) {
  Mark(RequestTrace::kCompleted);
  if (!svc_.backend().Healthy().ok()) svc_.ReportUnhealthy();
  // The plan goes now, with the stored inputs and intermediates it holds, so that the gauges
  // Reply reads no longer count them.
  launch_ = LaunchState();
  plan_.reset();
  ReleaseInputs();
  return [this, s] { Reply(s); };
}

void GraphCall::Reply(const absl::Status& s) {
  Mark(RequestTrace::kReplyBegin);
  absl::Status status = s;
  if (status.ok()) status = Respond(std::move(result_), queue_us_);
  svc_.UpdateStoreGauges();
  Finish(status);
}

void GraphCall::Finish(const absl::Status& s) {
  // No device work of the call is pending here (it failed before any was queued, or Done ran):
  // what the graph viewed goes before the client hears back, so its next call finds it free.
  ReleaseInputs();
  if (!s.ok()) ClearResponse();
  SetTotalUs(MicrosSince(start_));
  svc_.RecordRpc(rpc_, s, start_);
  if (svc_.metrics() != nullptr) svc_.metrics()->AddInflight(-1);
  Mark(RequestTrace::kFinished);
  grpc::ServerUnaryReactor::Finish(ToGrpcStatus(s));
}

void GraphCall::OnDone() {
  Mark(RequestTrace::kDone);
  svc_.CallDone();
  delete this;
}

}  // namespace opserve
