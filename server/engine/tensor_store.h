// Named tensors resident on the backend's device, shared across requests.
// Buffers are reference-counted: a graph that read a tensor keeps it alive even if it is deleted
// or overwritten meanwhile, and a failed request never leaves a half-written tensor behind
// because nothing is inserted until its bytes are complete.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/backend.h"
#include "server/ops/tensor.h"

namespace opserve {

// The end of every NOT_FOUND for a name the store lacks; the replica record
// (server/rpc/replica_identity.cc) recognises a missing stored tensor by it.
inline constexpr absl::string_view kNotStoredHere = " is not stored on this server";

// Rows [row_begin, row_begin + rows) of a sharded tensor, on one device.
struct TensorShard {
  int device = 0;  // index into the engine's devices
  int64_t row_begin = 0;
  int64_t rows = 0;
  BufferPtr buffer;
};

struct StoredTensor {
  std::string name;
  TensorMeta meta;
  BufferPtr buffer;  // null when sharded
  int device = 0;    // index into the engine's devices; unused when sharded
  // Non-empty: the tensor (rank 2) lives split by rows over these devices, in row order, each
  // shard charged to its own device's budget.
  std::vector<TensorShard> shards;
  // A copy still being made (a broadcast's destination): the bytes arrive in stream order, as
  // this says; the reader's stream waits for them (KernelEnv::arriving).
  std::shared_ptr<const InputArrival> arrival;
  bool sharded() const { return !shards.empty(); }
  // The shard's rows as a tensor of their own.
  TensorMeta ShardMeta(const TensorShard& s) const {
    TensorMeta m = meta;
    m.shape[0] = s.rows;
    return m;
  }
};
using StoredTensorPtr = std::shared_ptr<const StoredTensor>;

// Each method takes the caller's tenant (one per auth token; "" without auth): a name
// in one tenant is invisible to every other.
class TensorStore {
 public:
  // Looks a tensor up; NOT_FOUND names it.
  absl::StatusOr<StoredTensorPtr> Get(const std::string& name, const std::string& tenant = "") const;
  // Fails with ALREADY_EXISTS unless the name is free or `overwrite`.
  absl::Status CheckFree(const std::string& name, bool overwrite, const std::string& tenant = "") const;
  // Inserts all tensors or none: every name is checked before any is written. `still_wanted`,
  // when given, is asked last, under the store's lock: a request whose deadline passed or that was
  // cancelled while it ran stores nothing, and no reader can see its outputs in between.
  absl::Status InsertAll(std::vector<StoredTensorPtr> tensors, std::vector<bool> overwrite,
                         const std::string& tenant = "",
                         const std::function<absl::Status()>& still_wanted = nullptr);
  // Swaps `expected` (what Get returned) for `replacement` under the same name: ABORTED when the
  // name was deleted or overwritten meanwhile, so a move never undoes a concurrent write.
  absl::Status Replace(const StoredTensorPtr& expected, StoredTensorPtr replacement,
                       const std::string& tenant = "");
  absl::StatusOr<StoredTensorPtr> Erase(const std::string& name, const std::string& tenant = "");
  std::vector<StoredTensorPtr> List(const std::string& tenant = "") const;
  std::vector<StoredTensorPtr> ListAll() const;  // every tenant's
  size_t size() const;  // across namespaces

 private:
  using Key = std::pair<std::string, std::string>;  // (tenant, name)
  absl::Status CheckFreeLocked(const Key& key, bool overwrite) const;
  mutable std::mutex mu_;
  std::map<Key, StoredTensorPtr> tensors_;
};

// Tensor names: 1..256 bytes of [A-Za-z0-9_.:/-]; they show up in logs and messages.
absl::Status CheckTensorName(const std::string& name, absl::string_view what);

}  // namespace opserve
