// The paths of the protocol's HTTP/REST binding and the RPC each one is: one table, matched
// segment by segment (Triton's paths, with the optional /versions/{v}).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace opserve::http {

enum class Endpoint {
  kServerLive,
  kServerReady,
  kServerMetadata,
  kModelReady,
  kModelMetadata,
  kModelConfig,
  kModelStatistics,
  kModelInfer,
  kRepositoryIndex,
  kSharedMemoryStatus,
  kSharedMemoryRegister,
  kSharedMemoryUnregister,
  // Triton's endpoints that opserve does not serve, each its RPC (UNIMPLEMENTED, naming it).
  kRepositoryModelLoad,
  kRepositoryModelUnload,
  kTraceSetting,
  kLogSettings,
};

struct Route {
  Endpoint endpoint;
  std::string model, version;  // /v2/models/{model}[/versions/{version}]
  std::string region;          // /v2/{system,cuda}sharedmemory/region/{region}
  bool cuda = false;           // cudasharedmemory rather than systemsharedmemory
};

// The route of `method path`. NOT_FOUND naming the path when no endpoint has it;
// *method_not_allowed (and INVALID_ARGUMENT naming the method the path takes) when one has it
// with the other method.
absl::StatusOr<Route> FindRoute(absl::string_view method, absl::string_view path,
                                bool* method_not_allowed);

}  // namespace opserve::http
