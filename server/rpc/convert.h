// The only place where protobuf messages become engine types and engine results become
// responses. Handlers call these; nothing below server/rpc/ sees a .pb.h.
#pragma once

#include <string>

#include "opserve/v1/opserve.pb.h"
#include "server/engine/backend.h"
#include "server/engine/graph.h"
#include "server/engine/tensor_store.h"

namespace opserve::convert {

// The request's graph. It views the request (see graph.h): keep the request alive with it.
Graph GraphFromProto(const v1::ExecuteRequest& request);

// Nodes, returned outputs (their bytes moved), stored tensors and the engine's timings. The
// caller sets queue_us and total_us, which the engine does not see.
void ResultToProto(ExecuteResult result, v1::ExecuteResponse* response);

// A stored tensor as Delete, List, Put and Execute report it.
void TensorInfoToProto(const StoredTensor& tensor, const std::string& device,
                       v1::TensorInfo* info);

// Every op `backend` runs, with its algorithms and dtypes.
void OpsToProto(const Backend& backend, v1::ListOpsResponse* response);

}  // namespace opserve::convert
