// Saved graphs (SaveGraph): Execute requests kept under a name, which the Open Inference
// Protocol serves as models (inference_service.h).
#pragma once

#include <memory>
#include <string>

#include "opserve/v1/opserve.pb.h"
#include "server/rpc/tenant_map.h"

namespace opserve {

struct SavedGraph {
  v1::ExecuteRequest request;  // inline tensors: the inputs (dtype, shape with -1), no data
  v1::GraphInfo info;          // inputs, outputs (their dtype and shape as planned)
};
using SavedGraphPtr = std::shared_ptr<const SavedGraph>;

// At most this many saved graphs per tenant.
inline constexpr size_t kMaxSavedGraphs = 1024;

class GraphStore : public TenantMap<const SavedGraph> {
 public:
  GraphStore() : TenantMap("saved graph", kMaxSavedGraphs) {}
};

}  // namespace opserve
