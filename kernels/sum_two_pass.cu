// sum, two_pass: the textbook reduction. Pass 1: a grid of at most one full wave runs a
// grid-stride loop (4 scalar loads in flight per thread), then a shared-memory tree per block
// writes one partial per block. Pass 2: the same kernel, one block, over the partials.
// Deterministic: the grid depends only on n and the SM count, and every sum has a fixed order.
#include "kernels/sum.h"
#include "kernels/sum_common.cuh"

namespace opserve::kernels {
namespace {

using sum_internal::SumAccumT;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 2048 threads: full occupancy on sm_90
constexpr int kUnroll = 4;
static_assert((kThreads & (kThreads - 1)) == 0, "the halving tree needs a power of two");
static_assert(kThreads * kBlocksPerSm <= 2048, "one wave must fit the SM's thread slots");

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    sum_two_pass_kernel(const T* __restrict__ in, int64_t n, SumAccumT<T>* __restrict__ out) {
  using Acc = SumAccumT<T>;
  __shared__ Acc tree[kThreads];
  const int tid = threadIdx.x;
  tree[tid] = sum_internal::ThreadSumStrided<kUnroll>(in, n);
  __syncthreads();
  // Halve the live range each step; the barrier makes every write visible before its read.
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s) tree[tid] += tree[tid + s];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = tree[0];
}

template <typename T>
cudaError_t SumTwoPassImpl(void* d_temp, size_t* temp_bytes, const T* d_in, SumAccumT<T>* d_out,
                           int64_t n, cudaStream_t stream) {
  return sum_internal::TwoPassLaunch<kThreads, kUnroll, kBlocksPerSm>(
      sum_two_pass_kernel<T>, sum_two_pass_kernel<SumAccumT<T>>, d_temp, temp_bytes, d_in, d_out,
      n, stream);
}

}  // namespace

OPSERVE_DEFINE_SUM_OVERLOADS(SumTwoPass, SumTwoPassImpl)

}  // namespace opserve::kernels
