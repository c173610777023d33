// Row reduction, naive: one thread per row, reading its row front to back.
// The baseline: neighbouring threads read addresses `cols` floats apart, so a warp's loads are
// never coalesced, and a short grid (few rows) uses a handful of threads. Correct for any shape.
// FLOAT32 only. Included by the op files' instantiation .cu files (row_sum.cu, row_mean.cu).
#pragma once

#include <cstdint>

#include "kernels/reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace row_naive {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using reduce::Combine;
using reduce::Identity;

constexpr int kThreads = 256;
// A row is reduced in chunks of kChunk terms whose results are then combined: a single running
// float sum over 16M terms of magnitude ~1 drifts to ~1e-4 relative error; chunking keeps each
// running sum short (error ~ eps * sqrt(terms) per level).
constexpr int64_t kChunk = 1024;
// Grid cap: gridDim.x may not exceed 2^31 - 1; larger row counts are covered by the grid stride.
constexpr int64_t kMaxBlocks = 1 << 20;
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(kChunk > 0, "chunk must be positive");

template <typename Op, typename Out, typename Finish>
__global__ void __launch_bounds__(kThreads)
row_reduce_naive_kernel(const float* __restrict__ d_in, Out* __restrict__ d_out, int64_t rows,
                        int64_t cols, Finish finish) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; row < rows;
       row += stride) {
    const float* p = d_in + row * cols;
    float total = Identity<Op, float>();
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t c1 = c0 + kChunk < cols ? c0 + kChunk : cols;
      float chunk = Identity<Op, float>();
      for (int64_t c = c0; c < c1; ++c) chunk = Combine<Op>(chunk, p[c]);
      total = Combine<Op>(total, chunk);
    }
    d_out[row] = finish(total);
  }
}

template <typename Op, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const float* d_in, Out* d_out, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  if (d_temp == nullptr) {  // size query: no scratch needed
    *temp_bytes = 0;
    return cudaSuccess;
  }
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t blocks = CeilDiv<int64_t>(rows, kThreads);
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  using Finish = row_reduce::RowFinish<Op, Out>;
  row_reduce_naive_kernel<Op, Out><<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols,
                                                                  Finish::Make(cols));
  return LastLaunchError();
}

}  // namespace
}  // namespace row_naive

OPSERVE_DEFINE_ROW_REDUCE(RowReduceNaive, row_naive::Impl, float)

}  // namespace opserve::kernels
