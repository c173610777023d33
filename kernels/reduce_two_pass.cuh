// two_pass: the textbook reduction. Pass 1: a grid of at most one full wave runs a grid-stride
// loop (4 scalar loads in flight per thread), then a shared-memory tree per block writes one
// partial per block. Pass 2: the same kernel, one block, over the partials.
// Deterministic: the grid depends only on n and the SM count, and every reduction has a fixed
// order. Included by the op files' instantiation .cu files (sum.cu, max.cu...).
#pragma once

#include "kernels/reduce.h"
#include "kernels/reduce_common.cuh"

namespace opserve::kernels {
namespace two_pass {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using reduce::AccT;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 2048 threads: full occupancy on sm_90
constexpr int kUnroll = 4;
static_assert((kThreads & (kThreads - 1)) == 0, "the halving tree needs a power of two");
static_assert(kThreads * kBlocksPerSm <= 2048, "one wave must fit the SM's thread slots");

template <typename Op, typename T>
__global__ void __launch_bounds__(kThreads, LaunchMinBlocks(kThreads, kBlocksPerSm))
    reduce_two_pass_kernel(const T* __restrict__ in, int64_t n, AccT<Op, T>* __restrict__ out) {
  using Acc = AccT<Op, T>;
  __shared__ Acc tree[kThreads];
  const int tid = threadIdx.x;
  tree[tid] = reduce::ThreadReduceStrided<Op, kUnroll>(in, n);
  __syncthreads();
  // Halve the live range each step; the barrier makes every write visible before its read.
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s) tree[tid] = reduce::Combine<Op>(tree[tid], tree[tid + s]);
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = tree[0];
}

template <typename Op, typename T, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                 cudaStream_t stream) {
  return reduce::TwoPassLaunch<Op, kThreads, kUnroll, kBlocksPerSm>(
      reduce_two_pass_kernel<Op, T>, reduce_two_pass_kernel<Op, AccT<Op, T>>, d_temp, temp_bytes,
      d_in, d_out, n, stream);
}

}  // namespace
}  // namespace two_pass

OPSERVE_DEFINE_REDUCE_F32_I32(ReduceTwoPass, two_pass::Impl)

}  // namespace opserve::kernels
