// Validation and planning: a Graph (an Execute request, converted by the RPC layer) becomes a
// Plan, or a status that names the culprit.
// Everything a request can get wrong is caught here, on the handler's thread, before any device
// work: unknown ops and attributes, arity, dtypes and shapes, duplicate ids, cycles, dangling
// references, missing tensors, taken names, algorithms the backend lacks, and limits.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/graph.h"
#include "server/ops/op.h"
#include "server/engine/backend.h"
#include "server/engine/tensor_store.h"

namespace opserve {

struct Limits {
  uint64_t max_tensor_bytes = 0;   // any one tensor: stored, inline or intermediate
  int max_graph_nodes = 0;
  uint64_t max_message_bytes = 0;  // a response must fit one gRPC message
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
  absl::string_view data;  // host bytes (see graph.h)
  BufferPtr device;        // or device memory read in place
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
  // Fusion (server/engine/fuse.h): the request lets the planner fuse this node (it asks for
  // `auto` and does not set fuse=false).
  bool fusable = false;
  // Set on both nodes of a fused pattern: the rule's name, reported as their algorithm.
  absl::string_view fusion;
  // Set on the inner node: the node whose fused kernel computes its part. It runs nothing and
  // has no output buffer; its inputs are the fused node's.
  int fused_into = -1;
  bool returned = false;
  void* host_dest = nullptr;  // a returned output's bytes go here, not into the response
  BufferPtr device_dest;      // the node writes its output here (GraphOutput::device_dest)
  struct Store {
    std::string name;
    bool overwrite;
    std::string device;  // where to keep it, as the client named it; "": where the node ran
  };
  std::vector<Store> store_as;
};

struct Plan {
  std::vector<PlanNode> nodes;  // in topological order
  std::vector<PlanInline> inlines;
  std::string tenant;  // where stored inputs and outputs live (TensorStore)
  // What decides the device work, and nothing else: each node's op, algorithm, attributes, input
  // dtypes and shapes, and where its inputs come from. Plans with equal signatures queue the
  // same kernels on different tensors: the key of the CUDA-graph cache.
  std::string signature;
  // Whether CompletePlan commits the stored outputs itself. When not, it leaves them in
  // ExecuteResult::stored for the engine to place and commit (outputs kept on another device,
  // the parts of a sharded run).
  bool commit = true;
  int device = 0;  // the engine's index of the device it runs on
};

absl::StatusOr<Plan> BuildPlan(const Graph& graph, const Backend& backend,
                               const TensorStore& store, const Limits& limits,
                               const std::string& tenant = "");

// Plan::signature of `plan`'s nodes as they stand.
std::string PlanSignature(const Plan& plan);

// An upper bound on what an ExecuteResponse adds to its returned tensors' bytes.
uint64_t ResponseOverheadBytes(int num_nodes, size_t num_returned);

// A dtype (its wire value) and shape as sent, checked (rank, then CheckMeta) into a TensorMeta.
absl::StatusOr<TensorMeta> CheckedMeta(int dtype, std::span<const int64_t> shape,
                                       uint64_t max_bytes, absl::string_view what);

}  // namespace opserve
