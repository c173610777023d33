// The Open Inference Protocol's conversions (KServe v2, with Triton's shared-memory parameters):
// a ModelInferRequest becomes the engine's Graph and the engine's result becomes the
// ModelInferResponse, here and nowhere else, as convert.h does for opserve.v1. Both give the
// engine the same Graph. Models are the ops (inputs OpInputNames, output `y`) and the tenant's
// saved graphs.
//
// Each input carries its bytes one of four ways: a shared memory region (parameters
// shared_memory_region / _offset / _byte_size), a stored tensor (opserve_stored_tensor), typed
// `contents`, or the next entry of raw_input_contents (which the inputs with raw bytes take in
// order). Each requested output goes back in raw_output_contents (one entry per output, empty
// for those that went elsewhere), into a region, or into the store (opserve_store_as).
// Triton's parameters for what opserve's models are not (sequences, classification) are refused
// before any of that (oip_unserved_params.h).
#pragma once

#include <deque>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"
#include "server/engine/graph.h"
#include "server/rpc/graph_store.h"
#include "server/rpc/request_parsing.h"
#include "server/rpc/server_core.h"
#include "server/rpc/shared_memory.h"

namespace opserve::oip {

// Where a requested output goes.
struct InferOutput {
  std::string name;  // the model's output name
  std::string node;  // the node that makes it
  enum class To { kMessage, kRegion, kStore } to = To::kMessage;
  std::string region, store_as;
  uint64_t offset = 0, byte_size = 0;
};

// What a request's graph views and its response is built from, kept by the call from the
// conversion until the response is sent.
struct InferBinding {
  SavedGraphPtr saved;             // the saved graph the request runs; nullptr: an op model
  std::deque<std::string> owned;   // typed contents as bytes, and names the graph views
  std::vector<RegionRange> holds;  // the regions the graph reads and writes
  std::vector<InferOutput> outputs;  // in the response's order
};

// The request's graph for `tenant`: its model (an op or a saved graph of the tenant, through
// `core`), its inputs' bytes where they are, its outputs where they go.
absl::StatusOr<Graph> GraphFromInfer(const ParsedRequest<inference::ModelInferRequest>& parsed,
                                     const std::string& tenant, ServerCore& core,
                                     InferBinding* binding);

// The response to `request` from the result of its run, and the time it waited for the device.
void ResultToInfer(ExecuteResult result, double queue_us,
                   const inference::ModelInferRequest& request, const InferBinding& binding,
                   inference::ModelInferResponse* response);

// The response's total time, in its parameters as the other times are.
void SetTotalUs(double us, inference::ModelInferResponse* response);

// An op model's output name.
inline constexpr absl::string_view kOpOutputName = "y";

// An op model's input names, by its arity: `x`, or `a` and `b`.
std::span<const absl::string_view> OpInputNames(const OpSpec& op);

// "" and "1" name an op model's or saved graph's one version; NOT_FOUND for any other.
absl::Status CheckModelVersion(absl::string_view model, absl::string_view version);

}  // namespace opserve::oip
