// Start-up warm-up: runs every algorithm of the op table that the backend offers once, on a few
// square inputs, before the server listens. CUDA loads each kernel (and cuBLAS each GEMM kernel)
// on its first launch, which made a fresh server's first request of each algorithm slow (a
// 4096^2 transpose took 149 us instead of ~45, a row_mean 552 us instead of ~20, on the H100;
// the first 4096^3 cuBLAS GEMM ~97 ms instead of ~2.7 on the H200).
// Results are discarded; nothing is stored.
#pragma once

#include "absl/status/statusor.h"
#include "server/device_worker.h"

namespace opserve {

// The number of kernel runs, or the first error (which the caller may log and ignore: the
// server still works, only its first requests are slower).
absl::StatusOr<int> WarmUpKernels(Backend& backend, DeviceWorker& worker);

}  // namespace opserve
