#include "server/engine/engine.h"

#include <cstdlib>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/shard.h"

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

Engine::Engine(std::span<Device* const> devices, TensorStore& store, Metrics* metrics,
               Collectives* collectives, EngineOptions options)
    : store_(store), metrics_(metrics), collectives_(collectives), options_(std::move(options)) {
  for (Device* d : devices) {
    auto& e = devices_.emplace_back(std::make_unique<EngineDevice>());
    e->device = d;
    e->batcher = std::make_unique<Batcher>(options_.max_batch_size);
    e->name = d->backend().device();
    names_.push_back(e->name);
  }
#if OPSERVE_TEST_HOOKS
  if (const std::string& f = options_.fail_device; !f.empty()) {
    const size_t at = f.find('@');
    const std::string name = f.substr(0, at);
    for (int i = 0; i < num_devices(); ++i) {
      if (devices_[i]->name == name) fault_device_ = i;
    }
    fault_countdown_ = at == std::string::npos ? 1 : std::max(1, std::atoi(f.c_str() + at + 1));
  }
#endif
}

Engine::~Engine() = default;

void Engine::Submit(std::unique_ptr<Request> request) {
  request->engine_ = this;
  if (request->pinned_device_ < 0) BindStoredInputs(request->graph_, request->tenant_);
  if (ShardedRun::Wanted(*this, *request)) return ShardedRun::Start(*this, std::move(request));
  absl::StatusOr<int> d = request->pinned_device_ >= 0
                              ? absl::StatusOr<int>(request->pinned_device_)
                              : PlaceGraph(request->graph_);
  if (!d.ok()) return Request::Fail(std::move(request), d.status());
  if (absl::Status s = Serving(*d); !s.ok()) return Request::Fail(std::move(request), s);
  request->device_ = *d;
  absl::StatusOr<Plan> plan =
      BuildPlan(request->graph_, backend(*d), store_, options_.limits, request->tenant_);
  request->graph_ = Graph();  // the plan holds what it needs; the bytes stay the edge's
  if (!plan.ok()) return Request::Fail(std::move(request), plan.status());
  request->plan_ = *std::move(plan);
  request->plan_.device = *d;
  for (const PlanNode& n : request->plan_.nodes) {
    for (const PlanNode::Store& st : n.store_as) {
      if (st.device.empty()) continue;
      absl::StatusOr<int> dst = FindDevice(st.device, absl::StrCat("store_as ", Quote(st.name)));
      if (!dst.ok()) return Request::Fail(std::move(request), dst.status());
      if (*dst != *d) request->plan_.commit = false;
    }
  }
  if (request->pinned_device_ >= 0) request->plan_.commit = false;  // the sharded run commits
  if (absl::Status s = GatherInputs(*request, *d); !s.ok()) {
    return Request::Fail(std::move(request), s);
  }
  request->stage_ = Request::Stage::kPlanned;
  request->Mark(RequestTrace::kPlanned);
  Queue(std::move(request));
}

void Engine::Queue(std::unique_ptr<Request> request) {
  EngineDevice& dev = *devices_[request->device_];
  bool batch = dev.batcher->max_size() > 1 && Batchable(request->plan_);
#if OPSERVE_TEST_HOOKS
  if (const std::string& mode = options_.reply_without_device;
      !mode.empty() && MayAnswerUnrun(request->plan_)) {
    request->result_ = UnrunResult(request->plan_);
    request->unrun_ = true;
    request->unrun_on_launch_ = mode == "launch";
    if (mode == "handler") {
      AddLoad(request->device_, 1);
      request->Finish(absl::OkStatus());
      return request.release()->Reply();
    }
    batch = false;
  }
#endif
  // The engine's until its Reply hands it back: a lane may take it before Submit returns.
  request->stage_ = Request::Stage::kQueued;
  const int d = request->device_;
  AddLoad(d, 1);
  Request* queued = request.release();
  absl::Status s = batch ? dev.batcher->Join(queued, *dev.device) : dev.device->Submit(queued);
  if (!s.ok()) {
    AddLoad(d, -1);
    Request::Fail(std::unique_ptr<Request>(queued), s);
  }
}

void Engine::MarkFailed(int i, const absl::Status& why) {
  bool none_left = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto mark = [&](int d, absl::string_view message) {
      if (!devices_[d]->failed.ok()) return;
      devices_[d]->failed = absl::UnavailableError(
          absl::StrCat("device ", devices_[d]->name, " is out of service: ", message));
      std::cerr << "opserve: " << devices_[d]->failed.message() << std::endl;
      if (metrics_ != nullptr) metrics_->device(d).SetServing(false);
    };
    const bool first = devices_[i]->failed.ok();
    mark(i, why.message());
    // A sticky CUDA error is the process's, not the GPU's: the runtime fails every later call on
    // every device of the process (measured on two H200s: an illegal address on one GPU failed
    // the next launch on the other). So every GPU goes out with it, saying why.
    if (first && backend(i).name() == "cuda") {
      for (int d = 0; d < num_devices(); ++d) {
        if (d == i || backend(d).name() != "cuda") continue;
        mark(d, absl::StrCat("a sticky CUDA error on ", devices_[i]->name, " (", why.message(),
                             ") ends CUDA for every GPU of the process; restart the server"));
      }
    }
    for (const auto& d : devices_) none_left = none_left && !d->failed.ok();
  }
  if (none_left && on_unhealthy_) on_unhealthy_();
}

absl::Status Engine::Serving(int i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return devices_[i]->failed;
}

absl::Status Engine::AnyServing() const {
  absl::Status first;
  for (int i = 0; i < num_devices(); ++i) {
    absl::Status s = Serving(i);
    if (s.ok()) return s;
    if (first.ok()) first = s;
  }
  return first;
}

absl::StatusOr<int> Engine::FindDevice(absl::string_view name, absl::string_view what) const {
  for (int i = 0; i < num_devices(); ++i) {
    if (devices_[i]->name == name) {
      if (absl::Status s = Serving(i); !s.ok()) {
        return absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
      }
      return i;
    }
  }
  std::string names;
  for (const auto& d : devices_) absl::StrAppend(&names, names.empty() ? "" : ", ", d->name);
  return absl::InvalidArgumentError(absl::StrCat(what, ": device ", Quote(name),
                                                 " is not one this server serves (", names, ")"));
}

std::string Engine::DeviceOf(const StoredTensor& t) const {
  if (!t.sharded()) return devices_[t.device]->name;
  std::string names;
  for (const TensorShard& s : t.shards) {
    absl::StrAppend(&names, names.empty() ? "" : ",", devices_[s.device]->name);
  }
  return names;
}

absl::Status Engine::Readable(const StoredTensor& t) const {
  auto check = [&](int d) -> absl::Status {
    absl::Status s = Serving(d);
    if (s.ok()) return s;
    return absl::UnavailableError(absl::StrCat("tensor ", Quote(t.name), " lives on ", s.message()));
  };
  if (!t.sharded()) return check(t.device);
  for (const TensorShard& s : t.shards) RETURN_IF_ERROR(check(s.device));
  return absl::OkStatus();
}

void Engine::AddLoad(int i, int delta) {
  const int now = devices_[i]->load.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (metrics_ != nullptr) metrics_->device(i).SetQueueDepth(now);
}

void Engine::UpdateStoreGauges() {
  if (metrics_ == nullptr) return;
  std::vector<int64_t> tensors(devices_.size(), 0);
  for (const StoredTensorPtr& t : store_.ListAll()) {
    if (!t->sharded()) {
      ++tensors[t->device];
      continue;
    }
    for (const TensorShard& s : t->shards) ++tensors[s.device];
  }
  for (int i = 0; i < num_devices(); ++i) {
    const MemoryStats m = backend(i).Memory();
    DeviceMetrics& dm = metrics_->device(i);
    dm.SetMemory(m.used, m.budget, m.total);
    dm.SetTensors(tensors[i]);
  }
}

#if OPSERVE_TEST_HOOKS
bool Engine::TakeInjectedFault(int i) {
  return i == fault_device_ && fault_countdown_.fetch_sub(1) == 1;
}
#endif

}  // namespace opserve
