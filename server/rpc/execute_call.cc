// Execute, one call from edge to edge. The steps are the methods of ExecuteCall, in the order
// they run:
//   Start    (gRPC thread)  authenticate, convert the request, plan it, queue it on the device
//   Launch   (a lane's launch thread) queue the plan's work: inputs in, kernels, staging
//   Complete (the lane's completion thread) wait for that work, outputs out, commit
//   Reply    (the completion thread, once the queue slot is free) convert the result, finish
// A failure at any step goes straight to Finish with its status.
#include <chrono>
#include <memory>

#include "server/engine/executor.h"
#include "server/rpc/convert.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/service.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// A unary reactor that counts itself among the service's active calls until gRPC is done with
// it (the response sent), so that the drain on SIGTERM waits for it.
class ExecuteCall final : public grpc::ServerUnaryReactor {
 public:
  ExecuteCall(OpServeService& svc, grpc::CallbackServerContext* ctx,
              const v1::ExecuteRequest& req, v1::ExecuteResponse* resp)
      : svc_(svc), ctx_(ctx), req_(req), resp_(resp) {
    svc_.CallStarted();
    if (svc_.metrics() != nullptr) svc_.metrics()->AddInflight(1);
  }

  void Start() {
    auto tenant = svc_.Authenticate(ctx_);
    if (!tenant.ok()) return Finish(tenant.status());
    if (absl::Status healthy = svc_.backend().Healthy(); !healthy.ok()) {
      svc_.ReportUnhealthy();  // a transfer may have seen the failure first
      return Finish(healthy);
    }
    // A call that is already dead (its deadline passed in transit) neither plans nor queues.
    if (absl::Status alive = CheckCallAlive(ctx_); !alive.ok()) return Finish(alive);
    // The graph views req_, which gRPC keeps until OnDone: so do the plan's inline inputs.
    auto plan = BuildPlan(convert::GraphFromProto(req_), svc_.backend(), svc_.store(),
                          svc_.options().limits, *tenant);
    if (!plan.ok()) return Finish(plan.status());
    plan_ = std::make_unique<Plan>(*std::move(plan));
    absl::Status queued =
        svc_.device().SubmitAsync([this](ExecEnv& env) { return Launch(env); });
    if (!queued.ok()) Finish(queued);
  }

 private:
  DeviceWorker::Finisher Launch(ExecEnv& env) {
    queue_us_ = MicrosSince(start_);
    if (svc_.metrics() != nullptr) svc_.metrics()->RecordQueue("Execute", queue_us_ * 1e-6);
    absl::Status s = CheckCallAlive(ctx_);
    if (s.ok()) s = LaunchPlan(*plan_, env, svc_.metrics(), Options(), &launch_, &result_);
    if (!s.ok()) return [this, s](ExecEnv&) { return Done(s); };
    return [this](ExecEnv& env) {
      return Done(CompletePlan(*plan_, svc_.backend(), env, svc_.store(), svc_.metrics(),
                               Options(), launch_, &result_));
    };
  }

  ExecuteOptions Options() const {
    return {.check_alive = [ctx = ctx_] { return CheckCallAlive(ctx); },
            .fail_algorithm = svc_.options().fail_algorithm};
  }

  DeviceWorker::Completion Done(const absl::Status& s) {
    if (!svc_.backend().Healthy().ok()) svc_.ReportUnhealthy();
    // The plan goes now, with the stored inputs and intermediates it holds, so that the gauges
    // Reply reads no longer count them.
    launch_ = LaunchState();
    plan_.reset();
    return [this, s] { Reply(s); };
  }

  void Reply(const absl::Status& s) {
    if (s.ok()) convert::ResultToProto(std::move(result_), resp_);
    resp_->mutable_timing()->set_queue_us(queue_us_);
    svc_.UpdateStoreGauges();
    Finish(s);
  }

  void Finish(const absl::Status& s) {
    if (!s.ok()) resp_->Clear();
    resp_->mutable_timing()->set_total_us(MicrosSince(start_));
    svc_.RecordRpc("Execute", s, start_);
    if (svc_.metrics() != nullptr) svc_.metrics()->AddInflight(-1);
    grpc::ServerUnaryReactor::Finish(ToGrpcStatus(s));
  }

  void OnDone() override {
    svc_.CallDone();
    delete this;
  }

  OpServeService& svc_;
  grpc::CallbackServerContext* const ctx_;
  const v1::ExecuteRequest& req_;
  v1::ExecuteResponse* const resp_;
  const Clock::time_point start_ = Clock::now();
  std::unique_ptr<Plan> plan_;
  LaunchState launch_;
  ExecuteResult result_;
  double queue_us_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* OpServeService::Execute(grpc::CallbackServerContext* ctx,
                                                  const v1::ExecuteRequest* req,
                                                  v1::ExecuteResponse* resp) {
  auto* call = new ExecuteCall(*this, ctx, *req, resp);
  call->Start();
  return call;
}

}  // namespace opserve
