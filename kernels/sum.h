// sum: full reduction of n elements to one. Every launcher: FLOAT32 -> FLOAT32 and INT32 -> INT64
// (exact). vectorized, chunked and cub also take INT64 -> INT64 (exact; an overflow wraps modulo
// 2^64, as numpy's int64 sum does) and BFLOAT16 -> FLOAT32 (accumulated in float32).
// d_out points at one element of device memory. All launchers use the CUB two-phase temp
// convention (common.h), even those that need no scratch (they report 0 or 1 byte).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

// A shared-memory tree per block writes one partial per block; a second launch reduces them.
// Deterministic.
cudaError_t SumTwoPass(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                       int64_t n, cudaStream_t stream);
cudaError_t SumTwoPass(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                       int64_t n, cudaStream_t stream);

// As two_pass, but once 32 values remain per block the last warp finishes with __shfl_down_sync.
// Deterministic.
cudaError_t SumWarpShuffle(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                           int64_t n, cudaStream_t stream);
cudaError_t SumWarpShuffle(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                           int64_t n, cudaStream_t stream);

// One launch: each block reduces its slice and atomically adds it to d_out (zeroed with
// cudaMemsetAsync first). Float results depend on the order of the atomics: not deterministic.
cudaError_t SumOnePassAtomic(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                             int64_t n, cudaStream_t stream);
cudaError_t SumOnePassAtomic(void* d_temp, size_t* temp_bytes, const int32_t* d_in,
                             int64_t* d_out, int64_t n, cudaStream_t stream);

// Several 16-byte loads per thread in flight, a grid sized to the SM count, then a second pass.
// Deterministic.
cudaError_t SumVectorized(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                          int64_t n, cudaStream_t stream);
cudaError_t SumVectorized(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                          int64_t n, cudaStream_t stream);
cudaError_t SumVectorized(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,
                          int64_t n, cudaStream_t stream);
cudaError_t SumVectorized(void* d_temp, size_t* temp_bytes, const bf16_bits* d_in, float* d_out,
                          int64_t n, cudaStream_t stream);

// One block per contiguous 16 KiB chunk, as many blocks as chunks; the last blocks to finish add
// the partials in index order (one memset of completion counters per launch). Deterministic.
cudaError_t SumChunked(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                       int64_t n, cudaStream_t stream);
cudaError_t SumChunked(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                       int64_t n, cudaStream_t stream);
cudaError_t SumChunked(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,
                       int64_t n, cudaStream_t stream);
cudaError_t SumChunked(void* d_temp, size_t* temp_bytes, const bf16_bits* d_in, float* d_out,
                       int64_t n, cudaStream_t stream);

// cub::DeviceReduce::Sum (INT32 -> INT64 and BFLOAT16 -> FLOAT32 through TransformReduce with a
// widening transform, so CUB accumulates in the output type). Deterministic.
cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out, int64_t n,
                   cudaStream_t stream);
cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                   int64_t n, cudaStream_t stream);
cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,
                   int64_t n, cudaStream_t stream);
cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const bf16_bits* d_in, float* d_out,
                   int64_t n, cudaStream_t stream);

}  // namespace opserve::kernels
