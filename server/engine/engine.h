// The engine as the edge sees it: one device (its backend and worker), the tensor store, the
// metrics and the limits, and the one way in for a request that runs a graph (Submit). What a
// request passes through is in request.h.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "server/engine/batch.h"
#include "server/engine/device.h"
#include "server/engine/metrics.h"
#include "server/engine/plan.h"
#include "server/engine/request.h"
#include "server/engine/tensor_store.h"

namespace opserve {

struct EngineOptions {
  Limits limits;
  // Most requests that run as one plan (--max_batch_size; batch.h); 1: none.
  int max_batch_size = 1;
#if OPSERVE_TEST_HOOKS
  // "op/algorithm" whose every run fails as a faulty kernel would.
  std::string fail_algorithm;
  // Answer requests without running their graph, with zeros of the outputs' sizes: "handler" on
  // the submitting thread after planning, "launch" on a lane's launch thread (its slot freed
  // after the reply), "lane" through a lane's launch and completion threads. Graphs that store
  // an output or write one to a shared-memory region run as usual. It tells what the edge and
  // the hand-offs cost from what the device does (opserve-bench --load_variant).
  std::string reply_without_device;
#endif
};

class Engine {
 public:
  // `metrics` may be nullptr (no metrics); all three outlive the engine.
  Engine(Device& device, TensorStore& store, Metrics* metrics, EngineOptions options);

  // Plans the request on the calling thread and queues it on the device, alone or in a batch.
  // The request comes back through its client's Done, exactly once: at once when it fails here
  // (an invalid graph, a full queue), otherwise from a lane once it ran.
  void Submit(std::unique_ptr<Request> request);

  // Called when the backend failed for good (a sticky device error), by a request that saw it
  // or by the edge. Set once, before the server starts.
  void set_on_unhealthy(std::function<void()> f) { on_unhealthy_ = std::move(f); }
  void ReportUnhealthy() {
    if (on_unhealthy_) on_unhealthy_();
  }
  // The memory and tensor gauges, as they stand.
  void UpdateStoreGauges();

  Device& device() { return device_; }
  Backend& backend() { return device_.backend(); }
  TensorStore& store() { return store_; }
  Metrics* metrics() { return metrics_; }
  const EngineOptions& options() const { return options_; }

 private:
  Device& device_;
  TensorStore& store_;
  Metrics* const metrics_;
  const EngineOptions options_;
  Batcher batcher_;
  std::function<void()> on_unhealthy_;
};

}  // namespace opserve
