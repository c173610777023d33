// sum: full reduction of n elements to one. FLOAT32 -> FLOAT32; INT32 -> INT64 (exact).
// d_out points at one element of device memory. All launchers use the CUB two-phase temp
// convention (common.h), even those that need no scratch (they report 0 bytes).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

#define OPSERVE_DECLARE_SUM(Name)                                                             \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,        \
                   int64_t n, cudaStream_t stream);                                           \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,    \
                   int64_t n, cudaStream_t stream);

// A shared-memory tree per block writes one partial per block; a second launch reduces them.
// Deterministic.
OPSERVE_DECLARE_SUM(SumTwoPass)
// As two_pass, but once 32 values remain per block the last warp finishes with __shfl_down_sync.
// Deterministic.
OPSERVE_DECLARE_SUM(SumWarpShuffle)
// One launch: each block reduces its slice and atomically adds it to d_out (zeroed with
// cudaMemsetAsync first). Float results depend on the order of the atomics: not deterministic.
OPSERVE_DECLARE_SUM(SumOnePassAtomic)
// Several 16-byte loads per thread in flight, a grid sized to the SM count, then a second pass.
// Deterministic.
OPSERVE_DECLARE_SUM(SumVectorized)
// One block per contiguous 16 KiB chunk, as many blocks as chunks; the last blocks to finish add
// the partials in index order (one memset of completion counters per launch). Deterministic.
OPSERVE_DECLARE_SUM(SumChunked)
// cub::DeviceReduce::Sum (INT32 -> INT64 through a transform to int64). Deterministic.
OPSERVE_DECLARE_SUM(SumCub)

#undef OPSERVE_DECLARE_SUM

}  // namespace opserve::kernels
