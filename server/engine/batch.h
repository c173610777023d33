// Dynamic batching (--max_batch_size), a stage of the engine between planning and the device:
// requests of one plan signature and tenant that wait for a lane at the same time run as one
// plan, their nodes one after another, so on the GPU as one CUDA graph (one launch, one wait)
// instead of one each. The first such request opens a batch and queues it on the device as one
// job (BatchJob); requests of the same key that arrive while that job still waits for a lane join
// it, up to the most a batch holds; the lane that takes the job closes it. No request waits for a
// batch to fill: a batch holds whatever arrived while the lane was busy, as Triton's dynamic
// batcher does with no queue delay. Each request keeps its own nodes' kernel times (the graph
// stamps every node) and outputs, and replies on its own; the run's input, compute and output
// times are shared.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "server/engine/device.h"

#include "server/engine/graph.h"
#include "server/engine/plan.h"

namespace opserve {

// The most bytes a batchable request's nodes may move (their Cost): a request that waits for
// its batch waits for every member's kernels, which saves a launch-bound request more than it
// costs and a bandwidth-bound one nothing (4096x4096 row_mean lost 1-5% batched on an
// H200; docs/performance/history.md, "The service under concurrent load").
inline constexpr uint64_t kMaxBatchableBytes = 1 << 20;

// Whether a request may share a run with others: it is tiny (kMaxBatchableBytes), stores nothing
// (a stored output's commit is ordered with the requests around it) and writes no output to a
// place of its own (shared memory), which its run's failure or success must answer for alone.
bool Batchable(const Plan& plan);

// `plans` (of one signature and tenant, each Batchable) as one plan: their nodes and inline
// inputs in order, every index moved to its place in the whole.
Plan MergePlans(std::span<const Plan* const> plans);

// The result of a merged plan's run, back to its members: member i gets its own nodes' reports
// and returned outputs in its own order, and the run's times; batch_size is the members' count.
std::vector<ExecuteResult> SplitResult(ExecuteResult merged, std::span<const Plan* const> plans);

class BatchJob;
class Request;

class Batcher {
 public:
  // `max_size` 1 or less: every request runs alone.
  explicit Batcher(int max_size) : max_size_(max_size) {}
  int max_size() const { return max_size_; }

  // Queues `request` (planned, Batchable) in the open batch of its key, or opens one and queues
  // that on `device`. A status: the device refused the new batch, and the request is still the
  // caller's.
  absl::Status Join(Request* request, Device& device);

 private:
  friend class BatchJob;
  // A lane took `batch`: no request joins it any more.
  void Close(const std::string& key, const BatchJob* batch);

  const int max_size_;
  std::mutex mu_;
  // Per key, the batch whose job waits for a lane.
  absl::flat_hash_map<std::string, BatchJob*> open_;
};

}  // namespace opserve
