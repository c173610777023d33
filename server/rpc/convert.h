// opserve.v1's conversions: its messages become engine types and engine results become its
// responses, here and nowhere else. The Open Inference Protocol has its own (oip_convert.h); both
// produce the same Graph. Nothing below server/rpc/ sees a .pb.h.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/backend.h"
#include "server/engine/engine.h"
#include "server/engine/graph.h"
#include "server/engine/tensor_store.h"
#include "server/rpc/request_parsing.h"
#include "server/rpc/shared_memory.h"

namespace opserve::convert {

// The request's graph as sent. It views the request (see graph.h): keep the request alive with it.
Graph GraphFromProto(const v1::ExecuteRequest& request);

// An Execute call's graph for `tenant`: GraphFromProto, with each large inline tensor read where
// it was received (`lifts.lifted`) and each inline tensor in a shared-memory region read there,
// its range held in `holds` until the device is done with it.
absl::StatusOr<Graph> GraphFromExecute(const v1::ExecuteRequest& req, const ParsedLifts& lifts,
                                       SharedMemoryRegistry& regions, const std::string& tenant,
                                       std::vector<RegionRange>* holds);

// Nodes, returned outputs (their bytes moved), stored tensors and the engine's timings. The
// caller sets queue_us and total_us, which the engine does not see.
// `devices`: the engine's device names, by index (Engine::device_names), which name where the
// stored outputs live.
void ResultToProto(ExecuteResult result, v1::ExecuteResponse* response,
                   std::span<const std::string> devices = {});

// A stored tensor as Delete, List, Put, Move and Execute report it; `devices` as above.
void TensorInfoToProto(const StoredTensor& tensor, std::span<const std::string> devices,
                       v1::TensorInfo* info);

// Every op any of the engine's devices runs, with its algorithms and dtypes, and each device
// with what it runs, its memory and whether it serves.
void OpsToProto(const Engine& engine, v1::ListOpsResponse* response);

}  // namespace opserve::convert
