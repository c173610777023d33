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
#include "server/engine/backend.h"
#include "server/ops/tensor.h"

namespace opserve {

struct StoredTensor {
  std::string name;
  TensorMeta meta;
  BufferPtr buffer;
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
  absl::StatusOr<StoredTensorPtr> Erase(const std::string& name, const std::string& tenant = "");
  std::vector<StoredTensorPtr> List(const std::string& tenant = "") const;
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
