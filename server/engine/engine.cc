#include "server/engine/engine.h"

#include <utility>

namespace opserve {
namespace {

#if OPSERVE_TEST_HOOKS
// Whether the test hook EngineOptions::reply_without_device may answer this plan unrun: its
// outputs all go into the response, none where the client would look for it elsewhere (the
// store, a shared-memory region).
bool MayAnswerUnrun(const Plan& plan) {
  for (const PlanNode& n : plan.nodes) {
    if (!n.store_as.empty() || n.host_dest != nullptr || n.device_dest != nullptr) return false;
  }
  return true;
}

// What a plan would report and return, without running it.
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

Engine::Engine(Device& device, TensorStore& store, Metrics* metrics, EngineOptions options)
    : device_(device),
      store_(store),
      metrics_(metrics),
      options_(std::move(options)),
      batcher_(options_.max_batch_size) {}

void Engine::Submit(std::unique_ptr<Request> request) {
  request->engine_ = this;
  absl::StatusOr<Plan> plan =
      BuildPlan(request->graph_, backend(), store_, options_.limits, request->tenant_);
  request->graph_ = Graph();  // the plan holds what it needs; the bytes stay the edge's
  if (!plan.ok()) return Request::Fail(std::move(request), plan.status());
  request->plan_ = *std::move(plan);
  request->stage_ = Request::Stage::kPlanned;
  request->Mark(RequestTrace::kPlanned);
  bool batch = batcher_.max_size() > 1 && Batchable(request->plan_);
#if OPSERVE_TEST_HOOKS
  if (const std::string& mode = options_.reply_without_device;
      !mode.empty() && MayAnswerUnrun(request->plan_)) {
    request->result_ = UnrunResult(request->plan_);
    request->unrun_ = true;
    request->unrun_on_launch_ = mode == "launch";
    if (mode == "handler") {
      request->Finish(absl::OkStatus());
      return request.release()->Reply();
    }
    batch = false;
  }
#endif
  // The engine's until its Reply hands it back: a lane may take it before Submit returns.
  request->stage_ = Request::Stage::kQueued;
  Request* queued = request.release();
  absl::Status s = batch ? batcher_.Join(queued, device_) : device_.Submit(queued);
  if (!s.ok()) Request::Fail(std::unique_ptr<Request>(queued), s);
}

void Engine::UpdateStoreGauges() {
  if (metrics_ == nullptr) return;
  const MemoryStats m = backend().Memory();
  metrics_->SetMemory(m.used, m.budget, m.total);
  metrics_->SetTensors(static_cast<int64_t>(store_.size()));
}

}  // namespace opserve
