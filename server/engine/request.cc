#include "server/engine/request.h"

#include <utility>

#include "server/engine/engine.h"

namespace opserve {
namespace {

double MicrosSince(Request::Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Request::Clock::now() - t).count();
}

}  // namespace

Request::Request(absl::string_view rpc, Clock::time_point received, RequestTrace::Record* trace,
                 RequestClient& client, std::string tenant, Graph graph)
    : rpc_(rpc),
      received_(received),
      trace_(trace),
      client_(client),
      tenant_(std::move(tenant)),
      graph_(std::move(graph)) {}

absl::Status Request::BeginLaunch() {
  Mark(RequestTrace::kLaunchBegin);
  queue_us_ = MicrosSince(received_);
  if (engine_->metrics() != nullptr) {
    engine_->metrics()->RecordQueue(std::string_view(rpc_.data(), rpc_.size()), queue_us_ * 1e-6);
  }
  return client_.CheckAlive();
}

bool Request::Launch(ExecEnv& env) {
  status_ = BeginLaunch();
#if OPSERVE_TEST_HOOKS
  if (status_.ok() && unrun_) {
    if (!unrun_on_launch_) return true;  // Complete and Reply answer it, unrun
    // Replied before the job's slot is free: the next request may find the queue one fuller.
    Finish(absl::OkStatus());
    Reply();
    return false;
  }
#endif
  if (status_.ok()) status_ = LaunchPlan(plan_, env, engine_->metrics(), Options(), &launch_, &result_);
  stage_ = Stage::kLaunched;
  Mark(RequestTrace::kLaunchEnd);
  return true;
}

void Request::Complete(ExecEnv& env) {
  bool ran = status_.ok();
#if OPSERVE_TEST_HOOKS
  ran = ran && !unrun_;
#endif
  if (ran) {
    Mark(RequestTrace::kWaitBegin);
    status_ = CompletePlan(plan_, engine_->backend(), env, engine_->store(), engine_->metrics(),
                           Options(), launch_, &result_);
  }
  Finish(status_);
}

void Request::Finish(const absl::Status& status) {
  status_ = status;
  stage_ = Stage::kCompleted;
  Mark(RequestTrace::kCompleted);
  if (!engine_->backend().Healthy().ok()) engine_->ReportUnhealthy();
  // The plan goes now, with the stored inputs and intermediates it holds, so that the gauges
  // Reply reads no longer count them.
  launch_ = LaunchState();
  plan_ = Plan();
}

void Request::Reply() {
  stage_ = Stage::kReplied;
  Mark(RequestTrace::kReplyBegin);
  engine_->UpdateStoreGauges();
  client_.Done(std::unique_ptr<Request>(this));
}

void Request::Fail(std::unique_ptr<Request> request, const absl::Status& status) {
  request->status_ = status;
  RequestClient& client = request->client_;
  client.Done(std::move(request));
}

ExecuteOptions Request::Options() const {
  ExecuteOptions options{.check_alive = [client = &client_] { return client->CheckAlive(); }};
#if OPSERVE_TEST_HOOKS
  options.fail_algorithm = engine_->options().fail_algorithm;
#endif
  return options;
}

}  // namespace opserve
