// Dynamic batching, the engine's part: requests of one plan signature that wait for a lane
// together run as one plan, their nodes one after another, so on the GPU as one CUDA graph (one
// launch, one wait) instead of one each. Each request keeps its own nodes' kernel times (the
// graph stamps every node) and outputs; the run's input, compute and output times are shared.
// The RPC layer forms the batches (server/rpc/graph_batcher.h).
#pragma once

#include <span>
#include <vector>

#include "server/engine/graph.h"
#include "server/engine/plan.h"

namespace opserve {

// The most bytes a batchable request's nodes may move (their Cost): a request that waits for
// its batch waits for every member's kernels, which saves a launch-bound request more than it
// costs and a bandwidth-bound one nothing (4096x4096 row_mean lost 1-5% batched on the lent
// H200; PERFORMANCE.md, issue 14).
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

}  // namespace opserve
