// Dynamic batching, the RPC layer's part (--max_batch_size): graph calls of one plan signature
// and tenant that wait for a lane at the same time run as one plan (server/engine/batch.h). The
// first such call opens a batch and queues it on the device as one job; calls of the same key
// that arrive while that job still waits for a lane join it, up to the most a batch holds; the
// lane that takes the job closes it. No call waits for a batch to fill: a batch holds whatever
// arrived while the lane was busy, as Triton's dynamic batcher does with no queue delay.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace opserve {

class GraphCall;

struct GraphBatch {
  std::vector<GraphCall*> members;  // in arrival order; fixed once the batch is closed
};

class GraphBatcher {
 public:
  // `max_size` 1 or less: every call runs alone.
  explicit GraphBatcher(int max_size) : max_size_(max_size) {}
  int max_size() const { return max_size_; }

 private:
  friend class GraphCall;
  const int max_size_;
  std::mutex mu_;
  // Per key, the batch whose job waits for a lane.
  absl::flat_hash_map<std::string, std::shared_ptr<GraphBatch>> open_;
};

}  // namespace opserve
