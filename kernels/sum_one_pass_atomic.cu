// sum, one_pass_atomic: d_out is zeroed with cudaMemsetAsync, then one launch: a grid of at most
// one full wave runs a grid-stride loop (4 scalar loads in flight per thread), reduces each block
// by warp shuffles, and thread 0 of each block atomically adds the block's sum to *d_out.
// int32 -> int64 is exact (64-bit integer atomics wrap like two's-complement addition); float
// results depend on the order in which the atomics land: not deterministic.
#include "kernels/sum.h"
#include "kernels/sum_common.cuh"

namespace opserve::kernels {
namespace {

using sum_internal::SumAccumT;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 2048 threads: full occupancy on sm_90
constexpr int kUnroll = 4;
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(kThreads * kBlocksPerSm <= 2048, "one wave must fit the SM's thread slots");

__device__ __forceinline__ void AtomicAddTotal(float* out, float v) { atomicAdd(out, v); }

__device__ __forceinline__ void AtomicAddTotal(int64_t* out, int64_t v) {
  // There is no signed 64-bit atomicAdd; unsigned addition gives the same bits.
  static_assert(sizeof(int64_t) == sizeof(unsigned long long));
  atomicAdd(reinterpret_cast<unsigned long long*>(out), static_cast<unsigned long long>(v));
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    sum_one_pass_atomic_kernel(const T* __restrict__ in, int64_t n, SumAccumT<T>* __restrict__ out) {
  using Acc = SumAccumT<T>;
  const Acc block_sum =
      sum_internal::BlockReduceSum<kThreads>(sum_internal::ThreadSumStrided<kUnroll>(in, n));
  if (threadIdx.x == 0) AtomicAddTotal(out, block_sum);
}

template <typename T>
cudaError_t SumOnePassAtomicImpl(void* d_temp, size_t* temp_bytes, const T* d_in,
                                 SumAccumT<T>* d_out, int64_t n, cudaStream_t stream) {
  using Acc = SumAccumT<T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  if (d_temp == nullptr) {
    // No scratch is used, but report 1 byte, as CUB does on its scratch-free paths: a caller that
    // allocates "nothing" for 0 and passes nullptr again would otherwise only ever query.
    *temp_bytes = 1;
    return cudaSuccess;
  }
  int sm_count = 0;
  cudaError_t err = sum_internal::CurrentDeviceSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const int grid =
      sum_internal::FirstPassGrid(n, int64_t{kThreads} * kUnroll, sm_count, kBlocksPerSm);
  err = cudaMemsetAsync(d_out, 0, sizeof(Acc), stream);
  if (err != cudaSuccess) return err;
  sum_one_pass_atomic_kernel<T><<<grid, kThreads, 0, stream>>>(d_in, n, d_out);
  return LastLaunchError();
}

}  // namespace

OPSERVE_DEFINE_SUM_OVERLOADS(SumOnePassAtomic, SumOnePassAtomicImpl)

}  // namespace opserve::kernels
