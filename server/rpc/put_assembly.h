// The assembly of one PutTensor stream: a header, then chunks whose sizes must add up to the
// shape's bytes exactly. The bytes go into a budget-charged buffer on the device the header
// names (else the one with most budget free), or into one buffer per shard for a sharded put,
// and join the store only on Commit, so a failed, short, long or abandoned upload leaves
// nothing behind.
// Separate from the gRPC reactor so that tests and the fuzzer drive it directly.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/engine.h"
#include "server/engine/plan.h"
#include "server/engine/tensor_store.h"
#include "server/rpc/shared_memory.h"

namespace opserve {

class PutAssembly {
 public:
  // `regions`: where a header naming a shared-memory region finds it (nullptr: none).
  PutAssembly(Engine& engine, const Limits& limits, std::string tenant,
              SharedMemoryRegistry* regions = nullptr)
      : engine_(engine),
        store_(engine.store()),
        limits_(limits),
        tenant_(std::move(tenant)),
        regions_(regions) {}

  // One message of the stream, in order.
  absl::Status OnMessage(const v1::PutTensorRequest& msg);
  // The stream ended: checks the byte count, waits for the copies, inserts the tensor.
  // `still_wanted` is asked under the store's lock, last (TensorStore::InsertAll).
  absl::Status Commit(v1::TensorInfo* info,
                      const std::function<absl::Status()>& still_wanted = nullptr);
  uint64_t received() const { return received_; }

 private:
  absl::Status OnHeader(const v1::PutTensorHeader& h);
  absl::Status OnChunk(const std::string& chunk);

  Engine& engine_;
  TensorStore& store_;
  const Limits& limits_;
  const std::string tenant_;
  SharedMemoryRegistry* const regions_;
  bool from_region_ = false;  // the header's region held every byte: no chunk may follow
  std::shared_ptr<StoredTensor> tensor_;
  // Where the bytes go: the one buffer, or each shard's, in row order.
  std::vector<TensorShard> parts_;
  std::vector<std::unique_ptr<Uploader>> uploaders_;  // per part; after tensor_: destroyed first
  size_t part_ = 0;             // the part the next chunk bytes go to
  uint64_t part_received_ = 0;  // ... and how many it has
  bool overwrite_ = false;
  uint64_t received_ = 0;
};

}  // namespace opserve
