// The CUDA backend: device memory from a stream-ordered caching pool under a byte budget,
// pinned staging for uploads, a stream and cuBLAS handle per device lane, CUDA-event timing.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"

namespace opserve {

// Whether a usable GPU is present. On failure the status says why (no driver, no device, ...);
// a machine with the toolkit but no driver answers cudaErrorInsufficientDriver (35).
absl::Status ProbeCuda(int device);
// The GPUs this process sees (CUDA_VISIBLE_DEVICES applies); UNAVAILABLE with why when none.
absl::StatusOr<int> CudaDeviceCount();

// `budget_bytes` 0 means 90% of the device's free memory at start. `max_compute_capability`
// (e.g. 80; 0: none) caps the capability the backend reports, and so the rows of the op table it
// offers: a Hopper capped at 80 serves as an A100 would (--max_compute_capability). A GPU below
// kMinCudaComputeCapability is refused (FAILED_PRECONDITION): the kernels have no code for it.
// `graph_cache`: CUDA graphs kept per execution context for replay (CudaGraphCache); 0
// launches every node directly.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, uint64_t budget_bytes,
                                                         int max_compute_capability = 0,
                                                         int graph_cache = 0);

}  // namespace opserve
