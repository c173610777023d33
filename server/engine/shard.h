// A request over a sharded tensor runs as one request per shard, each on the shard's device,
// and their results are put back together: row-wise ops (row_sum, row_mean, row_max, row_min,
// matmul with the sharded tensor as A) give outputs sharded the same way, and sum / max / min of
// such a value combine the shards' partial results. A matmul's B, when stored, is broadcast to
// the shards' devices first (Collectives::Broadcast: NCCL on GPUs). A graph that uses a sharded
// tensor any other way is not split: the engine gathers the tensor onto one device instead.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "server/engine/collectives.h"
#include "server/engine/request.h"

namespace opserve {

class Engine;

class ShardedRun final : public RequestClient {
 public:
  // Whether `request` (submitted, not yet planned) reads a sharded tensor in a way that splits.
  static bool Wanted(Engine& engine, const Request& request);
  // Runs it: one part per shard, each submitted pinned to its device; `request` comes back
  // through its own client once every part is done.
  static void Start(Engine& engine, std::unique_ptr<Request> request);

  absl::Status CheckAlive() const override;
  void Done(std::unique_ptr<Request> part) override;

 private:
  ShardedRun(Engine& engine, std::unique_ptr<Request> request, StoredTensorPtr sharded);
  // Copies B (a matmul's stored second input) to its copies on the other shards' devices:
  // started in chunks and left running where the collectives can (each copy's arrival set,
  // the parts' GEMMs waiting chunk by chunk), else to completion.
  absl::Status Broadcast(Engine& engine, const StoredTensor& b, std::span<void* const> ptrs,
                         const std::vector<std::shared_ptr<StoredTensor>>& copies);
  // Waits for the broadcasts still running: their first error.
  absl::Status FinishBroadcasts();
  // Combines the parts' results into the request's and commits its stored outputs.
  absl::Status Combine();

  struct Arriving {
    std::unique_ptr<ArrivingBroadcast> broadcast;
    std::vector<std::shared_ptr<StoredTensor>> copies;
  };

  Engine& engine_;
  std::unique_ptr<Request> request_;
  const StoredTensorPtr sharded_;  // the tensor the parts split
  std::vector<StoredTensorPtr> broadcast_;  // B's copies the parts read, kept until they finish
  std::vector<Arriving> arriving_;          // broadcasts still running, each finished in Done
  std::mutex mu_;
  std::vector<std::unique_ptr<Request>> parts_;  // by shard, as they come back
  int pending_ = 0;
  uint64_t broadcast_bytes_ = 0;
  double broadcast_us_ = 0;  // broadcasts run to completion before the parts
  double arriving_us_ = 0;   // the longest broadcast that ran beside them
};

}  // namespace opserve
