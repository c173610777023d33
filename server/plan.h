// Validation and planning: an ExecuteRequest becomes a Plan, or a status that names the culprit.
// Everything a request can get wrong is caught here, on the handler's thread, before any device
// work: unknown ops and attributes, arity, dtypes and shapes, duplicate ids, cycles, dangling
// references, missing tensors, taken names, algorithms the backend lacks, and limits.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "opserve/v1/opserve.pb.h"
#include "server/ops.h"
#include "server/tensor_store.h"

namespace opserve {

struct Limits {
  uint64_t max_tensor_bytes = 0;   // any one tensor: stored, inline or intermediate
  int max_graph_nodes = 0;
  uint64_t max_message_bytes = 0;  // returned outputs must fit one response
};

struct PlanInput {
  enum class Source { kStored, kInline, kNode };
  Source source;
  StoredTensorPtr stored;  // kStored: held, so a concurrent delete cannot free it
  int index = -1;          // kInline: into Plan::inlines; kNode: into Plan::nodes
};

struct PlanInline {
  std::string name;
  TensorMeta meta;
  const std::string* data;  // the request's bytes; the request outlives the plan
};

struct PlanNode {
  std::string id;
  const OpSpec* op = nullptr;
  const AlgoSpec* algo = nullptr;
  AttrMap attrs;
  std::vector<PlanInput> inputs;
  std::vector<TensorMeta> input_meta;
  TensorMeta output;
  Cost cost;
  int last_use = -1;  // the last node (index) reading this output; -1 when none does
  bool returned = false;
  struct Store {
    std::string name;
    bool overwrite;
  };
  std::vector<Store> store_as;
};

struct Plan {
  std::vector<PlanNode> nodes;  // in topological order
  std::vector<PlanInline> inlines;
  std::string ns;  // the caller's tensor namespace: where stored inputs and outputs live
};

absl::StatusOr<Plan> BuildPlan(const v1::ExecuteRequest& request, const Backend& backend,
                               const TensorStore& store, const Limits& limits,
                               const std::string& ns = "");

// An upper bound on what an ExecuteResponse adds to its returned tensors' bytes.
uint64_t ResponseOverheadBytes(int num_nodes, size_t num_returned);

// Converts a proto dtype + shape to TensorMeta and checks it (CheckMeta).
absl::StatusOr<TensorMeta> MetaFromProto(int dtype, const google::protobuf::RepeatedField<int64_t>& shape,
                                         uint64_t max_bytes, absl::string_view what);

}  // namespace opserve
