// What an Open Inference Protocol model looks like to a client: ModelMetadata's answer for an
// op model (from the op table) and for a saved graph, and ModelConfig's, which Triton's clients
// read for the same inputs and outputs in model_config.proto's terms.
#pragma once

#include "inference/grpc_service.pb.h"
#include "server/ops/op.h"
#include "server/rpc/graph_store.h"

namespace opserve::oip {

// An op model: each input with the first dtype the device runs and the rank of the op's typical
// shapes, every dimension -1; the output as the op infers it. Platform "opserve_op".
void OpMetadata(const OpSpec& op, const DeviceProperties& device,
                inference::ModelMetadataResponse* resp);

// A saved graph: its inputs and outputs as SaveGraph planned them (-1 where free). Platform
// "opserve_graph".
void GraphMetadata(const SavedGraph& graph, inference::ModelMetadataResponse* resp);

// The model configuration of the model `meta` describes: its name, platform, inputs and outputs
// (data_type as Triton's DataType, dims as the metadata's shape), backend "opserve",
// max_batch_size 0, and the server's --max_batch_size as the parameter
// "opserve_max_batch_size".
void ConfigFromMetadata(const inference::ModelMetadataResponse& meta, int server_max_batch_size,
                        inference::ModelConfig* config);

}  // namespace opserve::oip
