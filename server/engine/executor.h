// Runs a Plan on a device lane in two halves. LaunchPlan, on the lane's launch thread: inputs
// in, nodes in order with per-node timing marks, returned outputs staged, all queued without
// waiting for the device. CompletePlan, on the lane's completion thread: one wait for the
// device, node times, outputs out (returned, or committed to the store).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/graph.h"
#include "server/engine/metrics.h"
#include "server/engine/plan.h"

namespace opserve {

struct ExecuteOptions {
  // Asked before each node and at the commit: a non-OK status (the deadline passed, the client
  // cancelled) abandons the request.
  std::function<absl::Status()> check_alive;
#if OPSERVE_TEST_HOOKS
  // Test builds only: "op/algorithm" that fails as a faulty kernel would (--test_fail_algorithm);
  // "*": every node (--test_fail_device).
  std::string fail_algorithm;
#endif
};

// What a launched request's queued work uses, held until CompletePlan.
struct LaunchState {
  std::vector<BufferPtr> inline_buffers;
  std::vector<BufferPtr> outputs;        // per node; intermediates already dropped are empty
  std::vector<bool> skipped;             // empty inputs: no kernel ran
  std::vector<void*> staged;             // returned outputs in host memory after the wait
  std::chrono::steady_clock::time_point compute_start;
};

// Queues the plan's device work on `env`. On failure the device is drained, nothing is stored,
// the status names the node, and CompletePlan must not be called.
absl::Status LaunchPlan(const Plan& plan, ExecEnv& env, DeviceMetrics* metrics,
                        const ExecuteOptions& options, LaunchState* launch,
                        ExecuteResult* result);
// Waits for the work LaunchPlan queued and fills `result`. On failure nothing is stored.
absl::Status CompletePlan(const Plan& plan, Backend& backend, ExecEnv& env, TensorStore& store,
                          DeviceMetrics* metrics, const ExecuteOptions& options, LaunchState& launch,
                          ExecuteResult* result);

// Both halves on one thread. Fills `result`. On failure nothing is stored and the status names
// the node.
absl::Status ExecutePlan(const Plan& plan, Backend& backend, ExecEnv& env, TensorStore& store,
                         DeviceMetrics* metrics, const ExecuteOptions& options, ExecuteResult* result);

}  // namespace opserve
