// row_sum / row_mean over a row-major [rows, cols] matrix -> [rows]. All launchers take
// FLOAT32 -> FLOAT32 (`mean` multiplies each sum by 1/cols). block_per_row, warp_per_row and
// cub_segmented also take:
//   - BFLOAT16 -> FLOAT32: accumulated in float32; `mean` as for FLOAT32;
//   - INT32 / INT64 -> INT64 (row_sum): exact int64 sums (an INT64 overflow wraps modulo 2^64, as
//     numpy's does); `mean` must be false;
//   - INT32 / INT64 -> FLOAT32 (row_mean): the exact int64 sum, then
//     static_cast<float>(static_cast<double>(sum) / static_cast<double>(cols)); `mean` must be
//     true.
// An integer overload called with the other `mean` returns cudaErrorInvalidValue (the output type
// says which of the two it is). All launchers use the CUB two-phase temp convention (common.h).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

// Every (input, output) pair of the launchers above but naive, as overloads of one name.
#define OPSERVE_DECLARE_ROW_REDUCE_ALL_TYPES(Name)                                             \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,         \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);                \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const bf16_bits* d_in, float* d_out,     \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);                \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,     \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);                \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,     \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);                \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const int32_t* d_in, float* d_out,       \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);                \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const int64_t* d_in, float* d_out,       \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);

// One thread per row. FLOAT32 only.
cudaError_t RowReduceNaive(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                           int64_t rows, int64_t cols, bool mean, cudaStream_t stream);
// One block per row, unrolled independent loads; the block size is chosen from rows vs the SM
// count and from the row's bytes, as llama.cpp's reduce_rows_f32 does from its floats.
OPSERVE_DECLARE_ROW_REDUCE_ALL_TYPES(RowReduceBlockPerRow)
// One warp per row: for short rows.
OPSERVE_DECLARE_ROW_REDUCE_ALL_TYPES(RowReduceWarpPerRow)
// cub::DeviceSegmentedReduce (Sum, or Reduce with a float32 / int64 accumulator), the mean
// applied as CUB writes each row.
OPSERVE_DECLARE_ROW_REDUCE_ALL_TYPES(RowReduceCubSegmented)

#undef OPSERVE_DECLARE_ROW_REDUCE_ALL_TYPES

}  // namespace opserve::kernels
