// Runs a Plan on a backend, on the device worker's thread: inputs in, nodes in order with
// per-node timing, one wait for the device, outputs out (returned inline or stored).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "opserve/v1/opserve.pb.h"
#include "server/metrics.h"
#include "server/plan.h"

namespace opserve {

struct ExecuteContext {
  Backend* backend;
  ExecEnv* env;
  TensorStore* store;
  Metrics* metrics;  // may be null
  // Called before each node: a non-OK status (deadline, cancellation) abandons the request.
  std::function<absl::Status()> check_alive;
  // Test builds: "op/algorithm" that fails as a faulty kernel would (--test_fail_algorithm).
  std::string fail_algorithm;
  // The response must fit one gRPC message: checked before anything is stored.
  uint64_t max_response_bytes = UINT64_MAX;
};

// Fills `response` (outputs, per-node results, and the input/compute/output timings).
// On failure nothing is stored and the status names the node.
absl::Status ExecutePlan(const Plan& plan, const ExecuteContext& ctx, v1::ExecuteResponse* response);

}  // namespace opserve
