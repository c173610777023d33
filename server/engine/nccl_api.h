// NCCL, found at run time: the entry points the CUDA collectives use, looked up in the loaded
// library, so that the server links no NCCL and runs without it (cuda_collectives.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"

#if OPSERVE_HAVE_NCCL_H
#include <nccl.h>
#else
// The few types the collectives pass to NCCL, as nccl.h defines them (its ABI has kept them since 2.0).
typedef struct ncclComm* ncclComm_t;
typedef enum { ncclSuccess = 0 } ncclResult_t;
typedef enum { ncclInt8 = 0 } ncclDataType_t;
#endif

namespace opserve {

// The NCCL entry points the collectives use, looked up in the loaded library.
struct NcclApi {
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  const char* (*last_error)(ncclComm_t) = nullptr;  // NCCL 2.13 on; may stay null
  std::string name;                                 // "nccl 2.28.9"
};

// Loads NCCL: "libnccl.so.2" from the loader's path, else the file $OPSERVE_NCCL_LIBRARY names.
// The library stays loaded for the process: its proxy threads may outlive a communicator.
absl::StatusOr<NcclApi> LoadNccl();

}  // namespace opserve
