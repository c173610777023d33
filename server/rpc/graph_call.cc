#include "server/rpc/graph_call.h"

#include "server/rpc/grpc_status.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

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
  absl::Status queued = svc_.device().SubmitAsync([this](ExecEnv& env) { return Launch(env); });
  if (!queued.ok()) Finish(queued);
}

DeviceWorker::Finisher GraphCall::Launch(ExecEnv& env) {
  Mark(RequestTrace::kLaunchBegin);
  queue_us_ = MicrosSince(start_);
  if (svc_.metrics() != nullptr) {
    svc_.metrics()->RecordQueue(std::string_view(rpc_.data(), rpc_.size()), queue_us_ * 1e-6);
  }
  absl::Status s = CheckCallAlive(ctx_);
  if (s.ok()) s = LaunchPlan(*plan_, env, svc_.metrics(), Options(), &launch_, &result_);
  Mark(RequestTrace::kLaunchEnd);
  if (!s.ok()) return [this, s](ExecEnv&) { return Done(s); };
  return [this](ExecEnv& env) {
    Mark(RequestTrace::kWaitBegin);
    return Done(CompletePlan(*plan_, svc_.backend(), env, svc_.store(), svc_.metrics(), Options(),
                             launch_, &result_));
  };
}

ExecuteOptions GraphCall::Options() const {
  return {.check_alive = [ctx = ctx_] { return CheckCallAlive(ctx); },
          .fail_algorithm = svc_.options().fail_algorithm};
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
