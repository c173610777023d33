// row_sum / row_mean, naive: one thread per row, reading its row front to back.
// The baseline: neighbouring threads read addresses `cols` floats apart, so a warp's loads are
// never coalesced, and a short grid (few rows) uses a handful of threads. Correct for any shape.
#include <cstdint>

#include "kernels/row_reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace {

constexpr int kThreads = 256;
// A row is summed in chunks of kChunk terms whose sums are then added: a single running float
// sum over 16M terms of magnitude ~1 drifts to ~1e-4 relative error; chunking keeps each running
// sum short (error ~ eps * sqrt(terms) per level).
constexpr int64_t kChunk = 1024;
// Grid cap: gridDim.x may not exceed 2^31 - 1; larger row counts are covered by the grid stride.
constexpr int64_t kMaxBlocks = 1 << 20;
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(kChunk > 0, "chunk must be positive");

__global__ void __launch_bounds__(kThreads)
row_reduce_naive_kernel(const float* __restrict__ d_in, float* __restrict__ d_out, int64_t rows,
                        int64_t cols, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; row < rows;
       row += stride) {
    const float* p = d_in + row * cols;
    float total = 0.0f;
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t c1 = c0 + kChunk < cols ? c0 + kChunk : cols;
      float chunk = 0.0f;
      for (int64_t c = c0; c < c1; ++c) chunk += p[c];
      total += chunk;
    }
    d_out[row] = total * scale;
  }
}

}  // namespace

cudaError_t RowReduceNaive(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                           int64_t rows, int64_t cols, bool mean, cudaStream_t stream) {
  if (d_temp == nullptr) {  // size query: no scratch needed
    *temp_bytes = 0;
    return cudaSuccess;
  }
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t blocks = CeilDiv<int64_t>(rows, kThreads);
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  row_reduce_naive_kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols,
                                                         row_reduce::OutputScale(cols, mean));
  return LastLaunchError();
}

}  // namespace opserve::kernels
