// warp_shuffle: as two_pass, but the shared-memory tree stops once 32 values remain and the first
// warp finishes with __shfl_down_sync (no barriers, no shared-memory round trips for the last five
// levels). Pass 1: a grid of at most one full wave runs a grid-stride loop (4 scalar loads in
// flight per thread) and writes one partial per block. Pass 2: the same kernel, one block, over
// the partials. Deterministic: the grid depends only on n and the SM count, and every reduction
// has a fixed order. Included by the op files' instantiation .cu files (sum.cu, max.cu...).
#pragma once

#include "kernels/reduce.h"
#include "kernels/reduce_common.cuh"

namespace opserve::kernels {
namespace warp_shuffle {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using reduce::AccT;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 2048 threads: full occupancy on sm_90
constexpr int kUnroll = 4;
static_assert((kThreads & (kThreads - 1)) == 0 && kThreads >= 64,
              "the halving tree needs a power of two that reaches exactly 32");
static_assert(kThreads * kBlocksPerSm <= 2048, "one wave must fit the SM's thread slots");

template <typename Op, typename T>
__global__ void __launch_bounds__(kThreads, LaunchMinBlocks(kThreads, kBlocksPerSm))
    reduce_warp_shuffle_kernel(const T* __restrict__ in, int64_t n,
                               AccT<Op, T>* __restrict__ out) {
  using Acc = AccT<Op, T>;
  __shared__ Acc tree[kThreads];
  const int tid = threadIdx.x;
  tree[tid] = reduce::ThreadReduceStrided<Op, kUnroll>(in, n);
  __syncthreads();
  // Shared-memory halving down to 32 values; the barrier orders each write before its read.
  for (int s = kThreads / 2; s >= 32; s >>= 1) {
    if (tid < s) tree[tid] = reduce::Combine<Op>(tree[tid], tree[tid + s]);
    __syncthreads();
  }
  if (tid < 32) {
    const Acc total = reduce::WarpReduce<Op>(tree[tid]);
    if (tid == 0) out[blockIdx.x] = total;
  }
}

template <typename Op, typename T, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                 cudaStream_t stream) {
  return reduce::TwoPassLaunch<Op, kThreads, kUnroll, kBlocksPerSm>(
      reduce_warp_shuffle_kernel<Op, T>, reduce_warp_shuffle_kernel<Op, AccT<Op, T>>, d_temp,
      temp_bytes, d_in, d_out, n, stream);
}

}  // namespace
}  // namespace warp_shuffle

OPSERVE_DEFINE_REDUCE_F32_I32(ReduceWarpShuffle, warp_shuffle::Impl)

}  // namespace opserve::kernels
