// An Execute request and its result in the engine's own terms: no protobuf. The RPC layer
// converts to and from these (server/rpc/convert.h); plan.h checks a Graph and turns it into a
// Plan, executor.h runs the Plan and fills an ExecuteResult.
//
// A Graph views the request it came from (names, shapes and tensor bytes are not copied): the
// request must outlive the Graph and the Plan built from it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/engine/tensor_store.h"
#include "server/ops/op.h"

namespace opserve {

struct GraphInput {
  enum class Source { kNone, kStored, kInline, kNode };
  Source source = Source::kNone;
  absl::string_view name;  // the stored tensor's name, the inline tensor's name or the node id
};

struct GraphNode {
  absl::string_view id;
  absl::string_view op;
  absl::string_view algorithm;  // "" or "auto": the op's choice
  // Attributes as sent; nullopt for one that carries no value.
  std::vector<std::pair<absl::string_view, std::optional<AttrValue>>> attrs;
  std::vector<GraphInput> inputs;
};

// A tensor sent with the request. The dtype is the wire value, known or not (CheckMeta names an
// unknown one by its number).
struct GraphInline {
  absl::string_view name;
  int dtype = 0;
  std::span<const int64_t> shape;
  // The host bytes: the request's, or a registered shared-memory region's, which the device
  // copies at the host link's speed.
  absl::string_view data;
  // Or device memory that already holds the tensor (a client's CUDA shared memory): read in
  // place, nothing copied. `data` is then empty.
  BufferPtr device;
};

struct GraphOutput {
  absl::string_view node;
  bool return_inline = false;
  absl::string_view store_as;  // "": not stored
  bool overwrite = false;
  // A returned output written here instead of into the response (a shared-memory region of
  // `host_dest_bytes` bytes); it does not count against the message limit.
  void* host_dest = nullptr;
  uint64_t host_dest_bytes = 0;
  // Or device memory the node writes its output into in place (a client's CUDA shared memory).
  BufferPtr device_dest;
  // The device store_as keeps it on, as the client names it ("cuda:1"); "": where it ran.
  absl::string_view device;
};

struct Graph {
  std::vector<GraphNode> nodes;
  std::vector<GraphInline> inlines;
  std::vector<GraphOutput> outputs;
  // Check the structure, dtypes and shapes only, not the inline bytes: a saved graph, whose
  // inline tensors are the inputs of later requests.
  bool shapes_only = false;
  // Stored inputs bound by the engine: a stored input named as one of these reads it instead of
  // the store's tensor of that name (a shard of a sharded tensor, in a request per shard).
  std::vector<StoredTensorPtr> bound;
  // The engine's index of the device the graph must run on (it reads or writes a client's CUDA
  // shared memory there); -1: placement chooses.
  int device = -1;
};

// What ran, per node, in the order the nodes ran.
struct NodeReport {
  std::string id;
  absl::string_view op;
  absl::string_view algorithm;  // the row that ran (after any fallback)
  TensorMeta output;
  double kernel_seconds = 0;    // 0 for a node whose input is empty (no kernel ran)
  Cost cost;
  // A node fused into another: that node's id. Its time and cost are the fused kernel's, which
  // that node reports too.
  std::string fused_into;
};

struct ReturnedTensor {
  std::string node;
  TensorMeta meta;
  std::string data;      // empty when written to its destination instead
  bool in_place = false;  // written to GraphOutput::host_dest or device_dest
};

struct ExecuteResult {
  std::vector<NodeReport> nodes;
  std::vector<ReturnedTensor> outputs;
  std::vector<StoredTensorPtr> stored;  // committed to the store, all or none
  double input_us = 0, compute_us = 0, output_us = 0;
  std::string device;  // where it ran: "cpu", "cuda:0"
  GraphReplay replay = GraphReplay::kNotUsed;
  int batch_size = 1;  // requests that ran as one plan with this one (server/engine/batch.h)
  // Bytes copied between devices for this request (stored inputs living elsewhere, a sharded
  // matmul's broadcast), and the time they took.
  uint64_t peer_copy_bytes = 0;
  double peer_copy_us = 0;
};

}  // namespace opserve
