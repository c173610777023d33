// Private helpers shared by the sum launchers (kernels/sum_*.cu). Not part of the kernel API.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/bf16_words.cuh"
#include "kernels/common.h"

namespace opserve::kernels::sum_internal {

// What each input type sums in, which is also the API's output type: float in float; bf16 in
// float (its 8-bit mantissa would lose a long sum); int32 exactly in int64; int64 in int64, where
// an overflow wraps modulo 2^64 as numpy's int64 sum does (two's complement add.s64; any order of
// wrapping adds gives the same residue). int64 -> int64 also serves the second pass over the
// int64 partials of int32 inputs.
template <typename T>
struct SumAccum;
template <>
struct SumAccum<float> {
  using type = float;
};
template <>
struct SumAccum<__nv_bfloat16> {
  using type = float;
};
template <>
struct SumAccum<int32_t> {
  using type = int64_t;
};
template <>
struct SumAccum<int64_t> {
  using type = int64_t;
};
template <typename T>
using SumAccumT = typename SumAccum<T>::type;

// One input element in its accumulator type. bf16 -> float is exact (the float's top 16 bits).
template <typename T>
__device__ __forceinline__ SumAccumT<T> ToAccum(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return static_cast<SumAccumT<T>>(v);
  }
}

// Devices whose SM count is cached; a higher ordinal just queries every time.
inline constexpr int kMaxCachedDevices = 64;

// The current device's SM count, cached per device: the grids (and so the float rounding order)
// are a function of n and this number only, which keeps float results deterministic per device.
inline cudaError_t CurrentDeviceSmCount(int* sm_count) {
  // Zero means "not yet known"; racing first calls store the same value.
  static std::atomic<int> cache[kMaxCachedDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= 0 && device < kMaxCachedDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) {
      *sm_count = cached;
      return cudaSuccess;
    }
  }
  int count = 0;
  err = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  if (count < 1) return cudaErrorInvalidDevice;
  if (device >= 0 && device < kMaxCachedDevices) cache[device].store(count, std::memory_order_relaxed);
  *sm_count = count;
  return cudaSuccess;
}

// Blocks for a grid-stride first pass: enough to cover n at `items_per_block` per block, at most
// one full wave (`blocks_per_sm` resident blocks on every SM), and at least one.
inline int FirstPassGrid(int64_t items, int64_t items_per_block, int sm_count, int blocks_per_sm) {
  const int64_t wanted = CeilDiv<int64_t>(items, items_per_block);
  const int64_t wave = static_cast<int64_t>(sm_count) * blocks_per_sm;
  const int64_t grid = wanted < wave ? wanted : wave;
  return grid < 1 ? 1 : static_cast<int>(grid);
}

// 16-byte vectors of the input types, for the 16-byte loads of sum/vectorized and sum/chunked:
// kLanes elements each, from the first 16-byte boundary of the input on. bf16 travels as a uint4
// of raw bits (8 lanes), since CUDA has no 8-wide bf16 vector type with an __ldg.
inline constexpr int kVecBytes = 16;
template <typename T>
struct SumVec;
template <>
struct SumVec<float> {
  using type = float4;
};
template <>
struct SumVec<int32_t> {
  using type = int4;
};
template <>
struct SumVec<int64_t> {
  using type = longlong2;
};
template <>
struct SumVec<__nv_bfloat16> {
  using type = uint4;
};
template <typename T>
using SumVecT = typename SumVec<T>::type;
template <typename T>
inline constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));
static_assert(sizeof(float4) == kVecBytes && sizeof(int4) == kVecBytes &&
              sizeof(longlong2) == kVecBytes && sizeof(uint4) == kVecBytes);
static_assert(kLanes<float> == 4 && kLanes<int32_t> == 4 && kLanes<int64_t> == 2 &&
              kLanes<__nv_bfloat16> == 8);

// Into *head: how many scalars of d_in precede its first 16-byte boundary (at most n).
// cudaErrorInvalidValue when d_in is not even aligned to its element.
template <typename T>
inline cudaError_t VectorHead(const T* d_in, int64_t n, int* head) {
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(d_in) % kVecBytes;
  if (misalign % sizeof(T) != 0) return cudaErrorInvalidValue;
  const int64_t wanted = misalign == 0 ? 0 : (kVecBytes - misalign) / sizeof(T);
  *head = static_cast<int>(wanted < n ? wanted : n);
  return cudaSuccess;
}

// Block 0's share of the scalars around the vectors: `head` before them and the tail after the
// n_vec vectors (at most kLanes - 1 each), one per thread; 0 in every other thread and block.
template <typename T>
__device__ __forceinline__ SumAccumT<T> HeadTailTerm(const T* __restrict__ in, int64_t n, int head,
                                                     int64_t n_vec) {
  static_assert(2 * (kLanes<T> - 1) <= 32, "one warp covers head and tail");
  if (blockIdx.x != 0) return SumAccumT<T>(0);
  const int64_t tail_begin = head + n_vec * kLanes<T>;
  const int tail = static_cast<int>(n - tail_begin);
  const int t = threadIdx.x;
  if (t < head) return ToAccum(__ldg(in + t));
  if (t < head + tail) return ToAccum(__ldg(in + tail_begin + (t - head)));
  return SumAccumT<T>(0);
}


// The lanes of one 16-byte vector of T, added in the accumulator type as a fixed tree.
template <typename T>
__device__ __forceinline__ SumAccumT<T> SumLanes(const SumVecT<T>& v) {
  using Acc = SumAccumT<T>;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return ((Bf16Lo(v.x) + Bf16Hi(v.x)) + (Bf16Lo(v.y) + Bf16Hi(v.y))) +
           ((Bf16Lo(v.z) + Bf16Hi(v.z)) + (Bf16Lo(v.w) + Bf16Hi(v.w)));
  } else if constexpr (kLanes<T> == 2) {
    return static_cast<Acc>(v.x) + static_cast<Acc>(v.y);
  } else {
    static_assert(kLanes<T> == 4, "float4 / int4");
    return (static_cast<Acc>(v.x) + static_cast<Acc>(v.y)) +
           (static_cast<Acc>(v.z) + static_cast<Acc>(v.w));
  }
}

template <typename Acc>
__device__ __forceinline__ Acc WarpReduceSum(Acc v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Block-wide sum by warp shuffles; the result is valid in thread 0 only. Fixed order, so
// deterministic. Its shared array is reused without a barrier: separate two calls in one kernel by
// a __syncthreads (sum_chunked does).
template <int kThreads, typename Acc>
__device__ __forceinline__ Acc BlockReduceSum(Acc v) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024,
                "whole warps, at most 32 of them, so one warp can finish");
  constexpr int kWarps = kThreads / 32;
  __shared__ Acc warp_sums[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpReduceSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  Acc total = Acc(0);
  if (warp == 0) total = WarpReduceSum(lane < kWarps ? warp_sums[lane] : Acc(0));
  return total;
}

// This thread's share of a grid-stride pass over in[0, n): kUnroll independent coalesced loads in
// flight per round, each into its own accumulator, combined pairwise at the end. Besides the
// memory-level parallelism, the separate accumulators cut float's serial rounding chain by
// kUnroll (about n / (4 * 270k threads) adds at n = 2^30 on 132 SMs).
template <int kUnroll, typename T>
__device__ __forceinline__ SumAccumT<T> ThreadSumStrided(const T* __restrict__ in, int64_t n) {
  static_assert(kUnroll >= 1 && (kUnroll & (kUnroll - 1)) == 0, "pairwise combine needs 2^k");
  using Acc = SumAccumT<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Acc acc[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) acc[u] = Acc(0);
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(in + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc[u] += static_cast<Acc>(v[u]);
  }
  // Fewer than kUnroll elements of this thread remain.
#pragma unroll
  for (int u = 0; u < kUnroll - 1; ++u) {
    if (i + u * stride < n) acc[u] += static_cast<Acc>(__ldg(in + i + u * stride));
  }
#pragma unroll
  for (int width = kUnroll / 2; width > 0; width /= 2) {
#pragma unroll
    for (int u = 0; u < width; ++u) acc[u] += acc[u + width];
  }
  return acc[0];
}

// The launch sequence of the sums whose kernel reduces its input to one partial per block and
// is run again, as one block, over those partials (sum_two_pass, sum_warp_shuffle).
// `first_pass` is the kernel for T, `second_pass` the same kernel for SumAccumT<T>, both
// (in, n, out) with kThreads threads a block. Pass 1 takes FirstPassGrid's grid (at most one
// full wave, so the float rounding order depends on n and the SM count only); its partials live
// in the caller's scratch (CUB's two-phase convention: d_temp == nullptr only reports the
// bytes). When one block covers n, its partial is the answer and there is no second launch.
template <int kThreads, int kUnroll, int kBlocksPerSm, typename FirstPass, typename SecondPass,
          typename T>
cudaError_t TwoPassLaunch(FirstPass first_pass, SecondPass second_pass, void* d_temp,
                          size_t* temp_bytes, const T* d_in, SumAccumT<T>* d_out, int64_t n,
                          cudaStream_t stream) {
  using Acc = SumAccumT<T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  int sm_count = 0;
  cudaError_t err = CurrentDeviceSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const int grid = FirstPassGrid(n, int64_t{kThreads} * kUnroll, sm_count, kBlocksPerSm);
  const size_t need = static_cast<size_t>(grid) * sizeof(Acc);
  if (d_temp == nullptr) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) return cudaErrorInvalidValue;

  if (grid == 1) {  // one block covers it: its partial is the answer
    first_pass<<<1, kThreads, 0, stream>>>(d_in, n, d_out);
    return LastLaunchError();
  }
  Acc* d_partials = static_cast<Acc*>(d_temp);
  first_pass<<<grid, kThreads, 0, stream>>>(d_in, n, d_partials);
  err = LastLaunchError();
  if (err != cudaSuccess) return err;
  second_pass<<<1, kThreads, 0, stream>>>(d_partials, grid, d_out);
  return LastLaunchError();
}

// The device element type behind a launcher's input type: bf16 crosses the API as raw bits
// (common.h), every other input type as itself.
template <typename T>
inline const T* AsDevice(const T* p) {
  return p;
}
inline const __nv_bfloat16* AsDevice(const bf16_bits* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}

// Second pass: one block sums `count` partials in a fixed order and writes the total to *out.
template <int kThreads, typename Acc>
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const Acc* __restrict__ partials, int count, Acc* __restrict__ out) {
  Acc v = Acc(0);
  for (int i = threadIdx.x; i < count; i += kThreads) v += partials[i];
  v = BlockReduceSum<kThreads>(v);
  if (threadIdx.x == 0) *out = v;
}

}  // namespace opserve::kernels::sum_internal

// Defines one public overload of kernels/sum.h, `Name(... const In* d_in, Out* d_out ...)`, by
// forwarding to `Impl`, the file's template over the device element type. sum.h declares
// overloads per dtype, not a template, on purpose: server/ops/cuda_launch.h tells a missing dtype
// by decltype on the overload set. Use inside namespace opserve::kernels.
#define OPSERVE_DEFINE_SUM_OVERLOAD(Name, Impl, In, Out)                                       \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out, int64_t n,    \
                   cudaStream_t stream) {                                                      \
    return Impl(d_temp, temp_bytes, sum_internal::AsDevice(d_in), d_out, n, stream);           \
  }

// The overloads every sum launcher has: FLOAT32 -> FLOAT32 and INT32 -> INT64.
#define OPSERVE_DEFINE_SUM_OVERLOADS(Name, Impl)            \
  OPSERVE_DEFINE_SUM_OVERLOAD(Name, Impl, float, float)     \
  OPSERVE_DEFINE_SUM_OVERLOAD(Name, Impl, int32_t, int64_t)

// Those and the two that vectorized and chunked add (sum.h): INT64 -> INT64, BFLOAT16 -> FLOAT32.
#define OPSERVE_DEFINE_SUM_OVERLOADS_ALL_DTYPES(Name, Impl)   \
  OPSERVE_DEFINE_SUM_OVERLOADS(Name, Impl)                    \
  OPSERVE_DEFINE_SUM_OVERLOAD(Name, Impl, int64_t, int64_t)   \
  OPSERVE_DEFINE_SUM_OVERLOAD(Name, Impl, bf16_bits, float)
