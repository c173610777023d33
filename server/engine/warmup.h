// Start-up warm-up: runs every algorithm of the op table that the device offers once, on a few
// square inputs, before the server listens. CUDA loads each kernel (and cuBLAS each GEMM kernel)
// on its first launch, which makes a fresh server's first request of each algorithm several
// times slower than the next (docs/performance/history.md has the figures).
// Results are discarded; nothing is stored.
#pragma once

#include "absl/status/statusor.h"
#include "server/engine/device.h"

namespace opserve {

// Warms every lane. The number of kernel runs on all lanes together, or the first error (which
// the caller may log and ignore: the server still works, only its first requests are slower).
absl::StatusOr<int> WarmUpKernels(Device& device);

}  // namespace opserve
