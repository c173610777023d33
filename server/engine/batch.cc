#include "server/engine/batch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/engine/engine.h"
#include "server/engine/request.h"

namespace opserve {

bool Batchable(const Plan& plan) {
  uint64_t bytes = 0;
  for (const PlanNode& n : plan.nodes) {
    if (!n.store_as.empty() || n.host_dest != nullptr || n.device_dest != nullptr) return false;
    bytes += n.cost.bytes;
  }
  return bytes <= kMaxBatchableBytes;
}

Plan MergePlans(std::span<const Plan* const> plans) {
  Plan merged;
  if (plans.empty()) return merged;
  merged.tenant = plans.front()->tenant;
  merged.device = plans.front()->device;
  for (const Plan* p : plans) {
    const int node_base = static_cast<int>(merged.nodes.size());
    const int inline_base = static_cast<int>(merged.inlines.size());
    merged.inlines.insert(merged.inlines.end(), p->inlines.begin(), p->inlines.end());
    for (PlanNode n : p->nodes) {
      for (PlanInput& in : n.inputs) {
        if (in.source == PlanInput::Source::kInline) in.index += inline_base;
        if (in.source == PlanInput::Source::kNode) in.index += node_base;
      }
      if (n.last_use >= 0) n.last_use += node_base;
      if (n.fused_into >= 0) n.fused_into += node_base;
      merged.nodes.push_back(std::move(n));
    }
  }
  merged.signature = PlanSignature(merged);
  return merged;
}

std::vector<ExecuteResult> SplitResult(ExecuteResult merged, std::span<const Plan* const> plans) {
  std::vector<ExecuteResult> parts(plans.size());
  size_t node = 0, output = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    ExecuteResult& r = parts[i];
    r.input_us = merged.input_us;
    r.compute_us = merged.compute_us;
    r.output_us = merged.output_us;
    r.device = merged.device;
    r.replay = merged.replay;
    r.batch_size = static_cast<int>(plans.size());
    for (const PlanNode& n : plans[i]->nodes) {
      if (node < merged.nodes.size()) r.nodes.push_back(std::move(merged.nodes[node]));
      ++node;
      // CompletePlan returns the outputs in node order.
      if (n.returned && output < merged.outputs.size()) {
        r.outputs.push_back(std::move(merged.outputs[output++]));
      }
    }
  }
  return parts;
}

// A batch of requests as one job of a lane. With one member it is that request's own job;
// with more, their plans run merged, and each member replies on its own.
class BatchJob final : public DeviceJob {
 public:
  BatchJob(Batcher& batcher, std::string key, Request* first)
      : batcher_(batcher), key_(std::move(key)), engine_(*first->engine_), device_(first->device_) {
    members_.push_back(first);
  }

  bool Launch(ExecEnv& env) override {
    batcher_.Close(key_, this);
    if (members_.size() == 1) return members_.front()->Launch(env);
#if OPSERVE_TEST_HOOKS
    options_.fail_algorithm = engine_.options().fail_algorithm;
#endif
    for (Request* m : members_) {
      // Each member's deadline is checked as the lane takes the batch; the run as a whole has none.
      if (absl::Status s = m->BeginLaunch(); !s.ok()) {
        m->status_ = s;
        gone_.push_back(m);
        continue;
      }
      live_.push_back(m);
      plans_.push_back(&m->plan_);
    }
    if (!live_.empty()) {
      merged_ = MergePlans(plans_);
      launched_ = LaunchPlan(merged_, env, engine_.device_metrics(device_), options_, &launch_, &result_);
    }
    for (Request* m : live_) {
      m->stage_ = Request::Stage::kLaunched;
      m->Mark(RequestTrace::kLaunchEnd);
    }
    return true;
  }

  void Complete(ExecEnv& env) override {
    if (members_.size() == 1) return members_.front()->Complete(env);
    for (Request* m : gone_) m->Finish(m->status_);
    absl::Status s = launched_;
    if (s.ok() && !live_.empty()) {
      for (Request* m : live_) m->Mark(RequestTrace::kWaitBegin);
      s = CompletePlan(merged_, engine_.backend(device_), env, engine_.store(), engine_.device_metrics(device_),
                       options_, launch_, &result_);
    }
    std::vector<ExecuteResult> parts;
    if (s.ok()) parts = SplitResult(std::move(result_), plans_);
    // The merged plan's buffers and stored inputs go before the members' own.
    launch_ = LaunchState();
    merged_ = Plan();
    plans_.clear();
    for (size_t i = 0; i < live_.size(); ++i) {
      if (s.ok()) live_[i]->result_ = std::move(parts[i]);
      live_[i]->Finish(s);
    }
  }

  void Reply() override {
    for (Request* m : members_) m->Reply();
    delete this;
  }

 private:
  friend class Batcher;
  ~BatchJob() = default;

  Batcher& batcher_;
  const std::string key_;
  Engine& engine_;
  const int device_;
  std::vector<Request*> members_;  // in arrival order; fixed once the batch is closed
  // The run, from Launch to Complete.
  ExecuteOptions options_;
  std::vector<Request*> live_;  // members still wanted as the lane took the batch
  std::vector<Request*> gone_;  // the others: their deadline passed, or they were cancelled
  std::vector<const Plan*> plans_;
  Plan merged_;
  LaunchState launch_;
  ExecuteResult result_;
  absl::Status launched_;
};

absl::Status Batcher::Join(Request* request, Device& device) {
  const Plan& plan = request->plan();
  std::string key = absl::StrCat(plan.tenant.size(), ":", plan.tenant, plan.signature);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(key);
  if (it != open_.end() && static_cast<int>(it->second->members_.size()) < max_size_) {
    it->second->members_.push_back(request);
    return absl::OkStatus();
  }
  auto* batch = new BatchJob(*this, key, request);
  // Under the lock: no request joins a batch whose job was refused.
  if (absl::Status queued = device.Submit(batch); !queued.ok()) {
    delete batch;
    return queued;
  }
  open_[std::move(key)] = batch;  // a full batch of the key stays queued, and closes itself
  return absl::OkStatus();
}

void Batcher::Close(const std::string& key, const BatchJob* batch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(key);
  if (it != open_.end() && it->second == batch) open_.erase(it);
}

}  // namespace opserve
