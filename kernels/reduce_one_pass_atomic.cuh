// one_pass_atomic: d_out is set to the identity (zeroed with cudaMemsetAsync), then one launch: a
// grid of at most one full wave runs a grid-stride loop (4 scalar loads in flight per thread),
// reduces each block by warp shuffles, and thread 0 of each block atomically combines the block's
// result into *d_out. Sum only: int32 -> int64 is exact (64-bit integer atomics wrap like
// two's-complement addition); float results depend on the order in which the atomics land: not
// deterministic. No Max / Min: float has no atomic max, and a compare-and-swap loop or the
// integer-ordering trick would lose the canonical NaN; vectorized serves those.
// Included by the op files' instantiation .cu files (sum.cu).
#pragma once

#include <type_traits>

#include "kernels/reduce.h"
#include "kernels/reduce_common.cuh"

namespace opserve::kernels {
namespace one_pass_atomic {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using reduce::AccT;

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

template <typename Op, typename T>
__global__ void __launch_bounds__(kThreads, LaunchMinBlocks(kThreads, kBlocksPerSm))
    reduce_one_pass_atomic_kernel(const T* __restrict__ in, int64_t n,
                                  AccT<Op, T>* __restrict__ out) {
  using Acc = AccT<Op, T>;
  const Acc block_total = reduce::BlockReduce<Op, kThreads>(
      reduce::ThreadReduceStrided<Op, kUnroll>(in, n));
  if (threadIdx.x == 0) AtomicAddTotal(out, block_total);
}

template <typename Op, typename T, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                 cudaStream_t stream) {
  static_assert(std::is_same_v<Op, Sum>, "the atomic is an add; zero bytes are its identity");
  static_assert(std::is_same_v<AccT<Op, T>, Out>, "blocks add into the output");
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  if (d_temp == nullptr) {
    // No scratch is used, but report 1 byte, as CUB does on its scratch-free paths: a caller that
    // allocates "nothing" for 0 and passes nullptr again would otherwise only ever query.
    *temp_bytes = 1;
    return cudaSuccess;
  }
  int sm_count = 0;
  cudaError_t err = reduce::CurrentDeviceSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const int grid = reduce::FirstPassGrid(n, int64_t{kThreads} * kUnroll, sm_count, kBlocksPerSm);
  err = cudaMemsetAsync(d_out, 0, sizeof(Out), stream);
  if (err != cudaSuccess) return err;
  reduce_one_pass_atomic_kernel<Op, T><<<grid, kThreads, 0, stream>>>(d_in, n, d_out);
  return LastLaunchError();
}

}  // namespace
}  // namespace one_pass_atomic

OPSERVE_DEFINE_REDUCE_F32_I32(ReduceOnePassAtomic, one_pass_atomic::Impl)

}  // namespace opserve::kernels
