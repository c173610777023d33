// Runs a Plan on a device, on one of its lanes' threads: inputs in, nodes in order with per-node
// timing, one wait for the device, outputs out (returned, or committed to the store).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "server/engine/graph.h"
#include "server/engine/metrics.h"
#include "server/engine/plan.h"

namespace opserve {

struct ExecuteOptions {
  // Asked before each node and at the commit: a non-OK status (the deadline passed, the client
  // cancelled) abandons the request.
  std::function<absl::Status()> check_alive;
  // Test builds: "op/algorithm" that fails as a faulty kernel would (--test_fail_algorithm).
  std::string fail_algorithm;
};

// Fills `result`. On failure nothing is stored and the status names the node.
absl::Status ExecutePlan(const Plan& plan, Backend& backend, ExecEnv& env, TensorStore& store,
                         Metrics* metrics, const ExecuteOptions& options, ExecuteResult* result);

}  // namespace opserve
