// The assembly of one PutTensor stream: a header, then chunks whose sizes must add up to the
// shape's bytes exactly. The bytes go into a budget-charged buffer that joins the store only on
// Commit, so a failed, short, long or abandoned upload leaves nothing behind.
// Separate from the gRPC reactor so that tests and the fuzzer drive it directly.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/plan.h"
#include "server/engine/tensor_store.h"
#include "server/rpc/shared_memory.h"

namespace opserve {

class PutAssembly {
 public:
  // `regions`: where a header naming a shared-memory region finds it (nullptr: none).
  PutAssembly(Backend& backend, TensorStore& store, const Limits& limits, std::string tenant,
              SharedMemoryRegistry* regions = nullptr)
      : backend_(backend),
        store_(store),
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

  Backend& backend_;
  TensorStore& store_;
  const Limits& limits_;
  const std::string tenant_;
  SharedMemoryRegistry* const regions_;
  bool from_region_ = false;  // the header's region held every byte: no chunk may follow
  std::shared_ptr<StoredTensor> tensor_;
  std::unique_ptr<Uploader> uploader_;  // declared after tensor_: destroyed first
  bool overwrite_ = false;
  uint64_t received_ = 0;
};

}  // namespace opserve
