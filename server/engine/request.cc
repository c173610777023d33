#include "server/engine/request.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
  if (DeviceMetrics* m = engine_->device_metrics(device_); m != nullptr) {
    m->RecordQueue(std::string_view(rpc_.data(), rpc_.size()), queue_us_ * 1e-6);
  }
  return client_.CheckAlive();
}

bool Request::Launch(ExecEnv& env) {
  status_ = BeginLaunch();
#if OPSERVE_TEST_HOOKS
  injected_fault_ = engine_->TakeInjectedFault(device_);
#endif
#if OPSERVE_TEST_HOOKS
  if (status_.ok() && unrun_) {
    if (!unrun_on_launch_) return true;  // Complete and Reply answer it, unrun
    // Replied before the job's slot is free: the next request may find the queue one fuller.
    Finish(absl::OkStatus());
    Reply();
    return false;
  }
#endif
  if (status_.ok()) {
    status_ = LaunchPlan(plan_, env, engine_->device_metrics(device_), Options(), &launch_, &result_);
  }
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
    status_ = CompletePlan(plan_, engine_->backend(device_), env, engine_->store(),
                           engine_->device_metrics(device_), Options(), launch_, &result_);
    if (status_.ok() && !plan_.commit && pinned_device_ < 0) status_ = CommitElsewhere();
  }
  Finish(status_);
}

void Request::Finish(const absl::Status& status) {
  status_ = status;
  // Inputs copied while the run went on: done by now where the run read them, waited for here
  // where it failed first. Their time overlaps the compute, so it is copy time, not input time.
  double arriving_us = 0;
  for (Arriving& a : arriving_) {
    double us = 0;
    if (absl::Status s = a.copy->Finish(&us); !s.ok() && status_.ok()) status_ = s;
    arriving_us = std::max(arriving_us, us);
    engine_->RecordPeerCopy(a.device, a.bytes, us * 1e-6);
  }
  arriving_.clear();
  result_.peer_copy_bytes += peer_bytes_;
  result_.peer_copy_us += peer_us_ + arriving_us;
  result_.input_us += peer_us_;
  stage_ = Stage::kCompleted;
  Mark(RequestTrace::kCompleted);
  if (absl::Status h = engine_->backend(device_).Healthy(); !h.ok()) {
    engine_->MarkFailed(device_, h);
  }
#if OPSERVE_TEST_HOOKS
  // The CPU backend has no sticky errors: the injected fault takes its device out here.
  if (injected_fault_) engine_->MarkFailed(device_, absl::UnavailableError("an injected device fault"));
#endif
  // The plan goes now, with the stored inputs and intermediates it holds, so that the gauges
  // Reply reads no longer count them.
  launch_ = LaunchState();
  plan_ = Plan();
}

void Request::Reply() {
  stage_ = Stage::kReplied;
  Mark(RequestTrace::kReplyBegin);
  engine_->UpdateStoreGauges();
  engine_->AddLoad(device_, -1);
  client_.Done(std::unique_ptr<Request>(this));
}

void Request::Fail(std::unique_ptr<Request> request, const absl::Status& status) {
  request->status_ = status;
  RequestClient& client = request->client_;
  client.Done(std::move(request));
}

absl::Status Request::CommitElsewhere() {
  std::vector<StoredTensorPtr> placed;
  std::vector<bool> overwrite;
  size_t k = 0;
  for (const PlanNode& n : plan_.nodes) {
    for (const PlanNode::Store& st : n.store_as) {
      if (k >= result_.stored.size()) return absl::InternalError("stored outputs out of step");
      StoredTensorPtr t = result_.stored[k++];
      if (!st.device.empty()) {
        ASSIGN_OR_RETURN(int dst, engine_->FindDevice(st.device, absl::StrCat("store_as ", Quote(st.name))));
        if (dst != t->device) {
          const Clock::time_point t0 = Clock::now();
          uint64_t bytes = 0;
          ASSIGN_OR_RETURN(t, engine_->CopyTo(*t, dst, &bytes));
          result_.peer_copy_bytes += bytes;
          result_.peer_copy_us += MicrosSince(t0);
          result_.output_us += MicrosSince(t0);
          engine_->RecordPeerCopy(dst, bytes, MicrosSince(t0) * 1e-6);
        }
      }
      placed.push_back(std::move(t));
      overwrite.push_back(st.overwrite);
    }
  }
  RETURN_IF_ERROR(engine_->store().InsertAll(placed, overwrite, plan_.tenant,
                                            [this] { return client_.CheckAlive(); }));
  result_.stored = std::move(placed);
  return absl::OkStatus();
}

ExecuteOptions Request::Options() const {
  ExecuteOptions options{.check_alive = [client = &client_] { return client->CheckAlive(); }};
#if OPSERVE_TEST_HOOKS
  options.fail_algorithm = injected_fault_ ? "*" : engine_->options().fail_algorithm;
#endif
  return options;
}

}  // namespace opserve
