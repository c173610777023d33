// Column sums and means of a row-major [rows, cols] matrix -> [cols]: what row_sum / row_mean of
// its transpose give, reading the matrix once and writing no transpose. The planner's fused
// kernel for row_sum(transpose(X)) and row_mean(transpose(X)) (server/ops/fusion.cc).
// The (input, output) pairs and `mean` rules of kernels/reduce.h (Sum, Mean), with rows and cols
// swapping roles: each output is the sum (or mean) of `rows` elements. CUB's two-phase temp
// convention (common.h): the scratch holds one partial row of sums per chunk of rows.
// Deterministic: each column's additions run in an order that depends only on the shape and
// the device's SM count.
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

#define OPSERVE_DECLARE_COL_REDUCE(In, Out)                                                   \
  cudaError_t ColReduce(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out,         \
                        int64_t rows, int64_t cols, bool mean, cudaStream_t stream);
OPSERVE_DECLARE_COL_REDUCE(float, float)
OPSERVE_DECLARE_COL_REDUCE(bf16_bits, float)
OPSERVE_DECLARE_COL_REDUCE(int32_t, int64_t)
OPSERVE_DECLARE_COL_REDUCE(int64_t, int64_t)
OPSERVE_DECLARE_COL_REDUCE(int32_t, float)
OPSERVE_DECLARE_COL_REDUCE(int64_t, float)
#undef OPSERVE_DECLARE_COL_REDUCE

}  // namespace opserve::kernels
