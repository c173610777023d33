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
  using Acc = SumAccumT<T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  int sm_count = 0;
  cudaError_t err = sum_internal::CurrentDeviceSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const int grid =
      sum_internal::FirstPassGrid(n, int64_t{kThreads} * kUnroll, sm_count, kBlocksPerSm);
  const size_t need = static_cast<size_t>(grid) * sizeof(Acc);
  if (d_temp == nullptr) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) return cudaErrorInvalidValue;

  if (grid == 1) {  // one block covers it: its partial is the answer
    sum_two_pass_kernel<T><<<1, kThreads, 0, stream>>>(d_in, n, d_out);
    return LastLaunchError();
  }
  Acc* d_partials = static_cast<Acc*>(d_temp);
  sum_two_pass_kernel<T><<<grid, kThreads, 0, stream>>>(d_in, n, d_partials);
  err = LastLaunchError();
  if (err != cudaSuccess) return err;
  sum_two_pass_kernel<Acc><<<1, kThreads, 0, stream>>>(d_partials, grid, d_out);
  return LastLaunchError();
}

}  // namespace

cudaError_t SumTwoPass(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                       int64_t n, cudaStream_t stream) {
  return SumTwoPassImpl(d_temp, temp_bytes, d_in, d_out, n, stream);
}

cudaError_t SumTwoPass(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                       int64_t n, cudaStream_t stream) {
  return SumTwoPassImpl(d_temp, temp_bytes, d_in, d_out, n, stream);
}

}  // namespace opserve::kernels
