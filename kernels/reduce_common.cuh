// Private helpers shared by the whole-tensor reductions (kernels/reduce_*.cuh), written against
// an operator (reduce_op.cuh). Not part of the kernel API.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/bf16_words.cuh"
#include "kernels/common.h"
#include "kernels/launch_bounds.cuh"
#include "kernels/reduce_op.cuh"

namespace opserve::kernels::reduce {

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

// 16-byte vectors of the input types, for the 16-byte loads of vectorized and chunked:
// kLanes elements each, from the first 16-byte boundary of the input on. bf16 travels as a uint4
// of raw bits (8 lanes), since CUDA has no 8-wide bf16 vector type with an __ldg.
inline constexpr int kVecBytes = 16;
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  using type = float4;
};
template <>
struct Vec16<int32_t> {
  using type = int4;
};
template <>
struct Vec16<int64_t> {
  using type = longlong2;
};
template <>
struct Vec16<__nv_bfloat16> {
  using type = uint4;
};
template <typename T>
using Vec16T = typename Vec16<T>::type;
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
// n_vec vectors (at most kLanes - 1 each), one per thread; the identity in every other thread and
// block.
template <typename Op, typename T>
__device__ __forceinline__ AccT<Op, T> HeadTailTerm(const T* __restrict__ in, int64_t n, int head,
                                                    int64_t n_vec) {
  static_assert(2 * (kLanes<T> - 1) <= 32, "one warp covers head and tail");
  using Acc = AccT<Op, T>;
  if (blockIdx.x != 0) return Identity<Op, Acc>();
  const int64_t tail_begin = head + n_vec * kLanes<T>;
  const int tail = static_cast<int>(n - tail_begin);
  const int t = threadIdx.x;
  if (t < head) return ToAcc<Op>(__ldg(in + t));
  if (t < head + tail) return ToAcc<Op>(__ldg(in + tail_begin + (t - head)));
  return Identity<Op, Acc>();
}


// The lanes of one 16-byte vector of T, combined in the accumulator type as a fixed tree.
template <typename Op, typename T>
__device__ __forceinline__ AccT<Op, T> ReduceLanes(const Vec16T<T>& v) {
  using Acc = AccT<Op, T>;
  auto op = [](Acc a, Acc b) { return Combine<Op>(a, b); };
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return op(op(op(Bf16Lo(v.x), Bf16Hi(v.x)), op(Bf16Lo(v.y), Bf16Hi(v.y))),
              op(op(Bf16Lo(v.z), Bf16Hi(v.z)), op(Bf16Lo(v.w), Bf16Hi(v.w))));
  } else if constexpr (kLanes<T> == 2) {
    return op(static_cast<Acc>(v.x), static_cast<Acc>(v.y));
  } else {
    static_assert(kLanes<T> == 4, "float4 / int4");
    return op(op(static_cast<Acc>(v.x), static_cast<Acc>(v.y)),
              op(static_cast<Acc>(v.z), static_cast<Acc>(v.w)));
  }
}

template <typename Op, typename Acc>
__device__ __forceinline__ Acc WarpReduce(Acc v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = Combine<Op>(v, __shfl_down_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Block-wide reduction by warp shuffles; the result is valid in thread 0 only. Fixed order, so
// deterministic. Its shared array is reused without a barrier: separate two calls in one kernel by
// a __syncthreads (chunked does).
template <typename Op, int kThreads, typename Acc>
__device__ __forceinline__ Acc BlockReduce(Acc v) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024,
                "whole warps, at most 32 of them, so one warp can finish");
  constexpr int kWarps = kThreads / 32;
  __shared__ Acc warp_totals[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpReduce<Op>(v);
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  Acc total = Identity<Op, Acc>();
  if (warp == 0) {
    total = WarpReduce<Op>(lane < kWarps ? warp_totals[lane] : Identity<Op, Acc>());
  }
  return total;
}

// This thread's share of a grid-stride pass over in[0, n): kUnroll independent coalesced loads in
// flight per round, each into its own accumulator, combined pairwise at the end. Besides the
// memory-level parallelism, the separate accumulators cut float's serial rounding chain by
// kUnroll (about n / (4 * 270k threads) adds at n = 2^30 on 132 SMs).
template <typename Op, int kUnroll, typename T>
__device__ __forceinline__ AccT<Op, T> ThreadReduceStrided(const T* __restrict__ in, int64_t n) {
  static_assert(kUnroll >= 1 && (kUnroll & (kUnroll - 1)) == 0, "pairwise combine needs 2^k");
  using Acc = AccT<Op, T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Acc acc[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) acc[u] = Identity<Op, Acc>();
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(in + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc[u] = Combine<Op>(acc[u], ToAcc<Op>(v[u]));
  }
  // Fewer than kUnroll elements of this thread remain.
#pragma unroll
  for (int u = 0; u < kUnroll - 1; ++u) {
    if (i + u * stride < n) acc[u] = Combine<Op>(acc[u], ToAcc<Op>(__ldg(in + i + u * stride)));
  }
#pragma unroll
  for (int width = kUnroll / 2; width > 0; width /= 2) {
#pragma unroll
    for (int u = 0; u < width; ++u) acc[u] = Combine<Op>(acc[u], acc[u + width]);
  }
  return acc[0];
}

// The launch sequence of the reductions whose kernel reduces its input to one partial per block
// and is run again, as one block, over those partials (two_pass, warp_shuffle). `first_pass` is
// the kernel for T, `second_pass` the same kernel for AccT<Op, T>, both (in, n, out) with kThreads
// threads a block. Pass 1 takes FirstPassGrid's grid (at most one full wave, so the float rounding
// order depends on n and the SM count only); its partials live in the caller's scratch (CUB's
// two-phase convention: d_temp == nullptr only reports the bytes). When one block covers n, its
// partial is the answer and there is no second launch.
template <typename Op, int kThreads, int kUnroll, int kBlocksPerSm, typename FirstPass,
          typename SecondPass, typename T, typename Out>
cudaError_t TwoPassLaunch(FirstPass first_pass, SecondPass second_pass, void* d_temp,
                          size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                          cudaStream_t stream) {
  using Acc = AccT<Op, T>;
  static_assert(std::is_same_v<Acc, Out>, "the partials are written where the output goes");
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

}  // namespace opserve::kernels::reduce

// Defines one public overload of kernels/reduce.h (the launcher `Name` for `In` inputs, a
// template over the operator) by forwarding to `Impl<Op>`, the algorithm's template over the
// device element type. Use inside namespace opserve::kernels.
#define OPSERVE_DEFINE_REDUCE(Name, Impl, In)                                               \
  template <typename Op>                                                                    \
  OPSERVE_REDUCE_SIGNATURE(Name, Op, In) {                                                  \
    return Impl<Op>(d_temp, temp_bytes, reduce::AsDevice(d_in), d_out, n, stream);          \
  }
#define OPSERVE_DEFINE_REDUCE_F32_I32(Name, Impl) \
  OPSERVE_DEFINE_REDUCE(Name, Impl, float)        \
  OPSERVE_DEFINE_REDUCE(Name, Impl, int32_t)
#define OPSERVE_DEFINE_REDUCE_ALL(Name, Impl)  \
  OPSERVE_DEFINE_REDUCE_F32_I32(Name, Impl)    \
  OPSERVE_DEFINE_REDUCE(Name, Impl, int64_t)   \
  OPSERVE_DEFINE_REDUCE(Name, Impl, bf16_bits)

// Explicit instantiations, for an op's .cu file (sum.cu, max.cu...): `Name` for operator `Op`
// over FLOAT32 and INT32, or over every input type. Use inside namespace opserve::kernels.
#define OPSERVE_INSTANTIATE_REDUCE(Name, Op, In) \
  template OPSERVE_REDUCE_SIGNATURE(Name<Op>, Op, In);
#define OPSERVE_INSTANTIATE_REDUCE_F32_I32(Name, Op) \
  OPSERVE_INSTANTIATE_REDUCE(Name, Op, float)        \
  OPSERVE_INSTANTIATE_REDUCE(Name, Op, int32_t)
#define OPSERVE_INSTANTIATE_REDUCE_ALL(Name, Op)  \
  OPSERVE_INSTANTIATE_REDUCE_F32_I32(Name, Op)    \
  OPSERVE_INSTANTIATE_REDUCE(Name, Op, int64_t)   \
  OPSERVE_INSTANTIATE_REDUCE(Name, Op, bf16_bits)
