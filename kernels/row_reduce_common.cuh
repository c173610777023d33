// Private helpers shared by the row_reduce_*.cu launchers (row_sum / row_mean over [rows, cols] of
// FLOAT32, BFLOAT16, INT32 or INT64). Not part of the kernel layer's public surface.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/bf16_words.cuh"
#include "kernels/common.h"

namespace opserve::kernels::row_reduce {

constexpr int kWarpSize = 32;

// Host: what each float-accumulated output (FLOAT32 and BFLOAT16 inputs) is multiplied by. A sum
// is left exact (x * 1.0f == x); a mean uses 1/cols rounded once from double, so one rounding step
// more than a division, far under any float32 tolerance, and a multiply instead of a divide per
// row.
inline float OutputScale(int64_t cols, bool mean) {
  return mean ? static_cast<float>(1.0 / static_cast<double>(cols)) : 1.0f;
}

// Host: multiprocessor count of the current device (grid sizing only).
inline cudaError_t CurrentSmCount(int* sm_count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

// ---- Element types ----
// Each input type's accumulator (float for float and bf16, int64 for the integers: exact sums),
// its 16-byte vector (bf16 as 8 raw halves in a uint4), and the vector's lane count.
template <typename In>
struct Elem;
template <>
struct Elem<float> {
  using Acc = float;
  using Vec = float4;
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  using Vec = uint4;
};
template <>
struct Elem<int32_t> {
  using Acc = int64_t;
  using Vec = int4;
};
template <>
struct Elem<int64_t> {
  using Acc = int64_t;
  using Vec = longlong2;
};
template <typename In>
using AccT = typename Elem<In>::Acc;
template <typename In>
using VecT = typename Elem<In>::Vec;

constexpr int kVecBytes = 16;
template <typename In>
inline constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(In));
static_assert(sizeof(float4) == kVecBytes && sizeof(uint4) == kVecBytes &&
              sizeof(int4) == kVecBytes && sizeof(longlong2) == kVecBytes);

// ---- What each output is made of its row's sum ----
// RowFinish<Acc, Out>: the launcher's (In, Out, mean) combination, built on the host by Make
// (false when `mean` does not fit the output type: an integer row_sum has INT64 output, an integer
// row_mean FLOAT32), applied on the device to each row's sum.
template <typename Acc, typename Out>
struct RowFinish;
// float / bf16 input: the float sum times OutputScale.
template <>
struct RowFinish<float, float> {
  float scale;
  static bool Make(int64_t cols, bool mean, RowFinish* f) {
    f->scale = OutputScale(cols, mean);
    return true;
  }
  __device__ __forceinline__ float operator()(float sum) const { return sum * scale; }
};
// Integer row_sum: the exact int64 sum (an int64 overflow wraps modulo 2^64, as numpy's does).
template <>
struct RowFinish<int64_t, int64_t> {
  static bool Make(int64_t /*cols*/, bool mean, RowFinish* /*f*/) { return !mean; }
  __device__ __forceinline__ int64_t operator()(int64_t sum) const { return sum; }
};
// Integer row_mean: the exact int64 sum divided by cols in double, rounded once to float.
// Out of line: the double division (Newton steps and a slow path) inlined into warp_per_row's
// pipelined short-row kernel spilled at its 64-register cap; it runs once per row.
__device__ __noinline__ inline float IntRowMean(int64_t sum, int64_t cols) {
  return static_cast<float>(static_cast<double>(sum) / static_cast<double>(cols));
}
template <>
struct RowFinish<int64_t, float> {
  int64_t cols;
  static bool Make(int64_t cols, bool mean, RowFinish* f) {
    f->cols = cols;
    return mean;
  }
  __device__ __forceinline__ float operator()(int64_t sum) const { return IntRowMean(sum, cols); }
};
// The partials of a split row: the sum as it is (the second pass applies the real finish).
struct KeepSum {
  template <typename Acc>
  __device__ __forceinline__ Acc operator()(Acc sum) const {
    return sum;
  }
};

// ---- Loads and lane arithmetic ----
// The one place where input is read, so a cache hint can be tried in one line. LDG through the
// read-only path, as CUB's LOAD_LDG does: every byte is read exactly once.
template <typename T>
__device__ __forceinline__ T LoadStreaming(const T* p) {
  return __ldg(p);
}

template <typename In>
__device__ __forceinline__ In ZeroElem() {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    return __ushort_as_bfloat16(0);
  } else {
    return In(0);
  }
}

template <typename In>
__device__ __forceinline__ VecT<In> ZeroVec() {
  VecT<In> v;
  v.x = 0;
  v.y = 0;
  if constexpr (kLanes<In> != 2) {  // longlong2 has no z, w
    v.z = 0;
    v.w = 0;
  }
  return v;
}

// One element in its accumulator type (bf16 -> float is exact: a bf16 is a float's top half).
template <typename In>
__device__ __forceinline__ AccT<In> ToAcc(In x) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return static_cast<AccT<In>>(x);
  }
}


// The kLanes elements of one vector, in address order, in the accumulator type.
template <typename In>
__device__ __forceinline__ void VecToAcc(const VecT<In>& v, AccT<In> (&a)[kLanes<In>]) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[2 * k] = Bf16Lo(w[k]);
      a[2 * k + 1] = Bf16Hi(w[k]);
    }
  } else if constexpr (kLanes<In> == 2) {
    a[0] = v.x;
    a[1] = v.y;
  } else {
    a[0] = v.x;
    a[1] = v.y;
    a[2] = v.z;
    a[3] = v.w;
  }
}

// Pairwise sum of neighbours, level by level: ((a0 + a1) + (a2 + a3)) + ... A fixed shape.
template <int kN, typename Acc>
__device__ __forceinline__ Acc TreeSum(Acc (&a)[kN]) {
  static_assert(kN >= 1 && (kN & (kN - 1)) == 0, "a power of two");
#pragma unroll
  for (int width = 1; width < kN; width *= 2) {
#pragma unroll
    for (int i = 0; i + width < kN; i += 2 * width) a[i] += a[i + width];
  }
  return a[0];
}

// A thread's running sums over 16-byte vectors. float: one per lane (4), which keeps each float
// rounding chain short. bf16: one per 32-bit word (4), its two halves added first. Integers are
// exact in any order, so they keep 2 running int64 sums (4 registers; 4 sums would spill the
// int32 warp kernel at the 64-register cap).
template <typename In>
inline constexpr int kAccLanes = std::is_same_v<AccT<In>, int64_t> ? 2 : 4;

template <typename In>
__device__ __forceinline__ void AddVec(AccT<In> (&acc)[kAccLanes<In>], const VecT<In>& v) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    acc[0] += Bf16Lo(v.x) + Bf16Hi(v.x);
    acc[1] += Bf16Lo(v.y) + Bf16Hi(v.y);
    acc[2] += Bf16Lo(v.z) + Bf16Hi(v.z);
    acc[3] += Bf16Lo(v.w) + Bf16Hi(v.w);
  } else if constexpr (std::is_same_v<In, int32_t>) {
    acc[0] += int64_t{v.x} + int64_t{v.y};
    acc[1] += int64_t{v.z} + int64_t{v.w};
  } else if constexpr (kLanes<In> == 2) {
    acc[0] += v.x;
    acc[1] += v.y;
  } else {
    acc[0] += v.x;
    acc[1] += v.y;
    acc[2] += v.z;
    acc[3] += v.w;
  }
}

// ---- Warp and block sums ----
// Butterfly sum over aligned groups of kGroup lanes (a power of two <= 32). Every lane of the
// warp must call it (full mask); every lane of a group ends with the group's sum. The tree shape
// is fixed, so the result is deterministic.
template <int kGroup, typename Acc>
__device__ __forceinline__ Acc GroupSum(Acc v) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0,
                "group must be a power of two within a warp");
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <typename Acc>
__device__ __forceinline__ Acc WarpSum(Acc v) {
  return GroupSum<kWarpSize>(v);
}

// Block-wide sum; the result is valid in thread 0 only. Ends with no barrier pending, but a caller
// that calls it again must __syncthreads() in between (warp_sums is reused).
template <int kThreads, typename Acc>
__device__ __forceinline__ Acc BlockSum(Acc v) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024");
  v = WarpSum(v);
  if constexpr (kThreads == kWarpSize) {
    return v;
  } else {
    constexpr int kWarps = kThreads / kWarpSize;
    __shared__ Acc warp_sums[kWarps];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = Acc(0);
    if (warp == 0) {
      v = lane < kWarps ? warp_sums[lane] : Acc(0);
      v = WarpSum(v);
    }
    return v;
  }
}

// This thread's share of the sum of p[0, n), for a team of kTeam threads in which this one is
// `rank` (0 <= rank < kTeam). Any alignment of p to its element size: a scalar head up to the
// first 16-byte boundary, then 16-byte vector loads, then a scalar tail (head and tail each
// shorter than one vector: 3 floats or int32, 7 bf16, 1 int64).
// Body loads go kUnroll at a time, all issued before any is added, so a thread has up to
// kUnroll 16-byte loads in flight; the last partial round is predicated, not a scalar loop, so
// short ranges still issue their loads together. Accumulation: kAccLanes running sums per thread
// (4 for float and bf16, 2 for the exact integer sums), then the caller's tree, so each float
// running sum sees about n / (4 * kTeam) terms.
template <int kTeam, int kUnroll, typename In>
__device__ __forceinline__ AccT<In> TeamPartialSum(const In* __restrict__ p, int64_t n, int rank) {
  static_assert(kTeam >= 1 && kUnroll >= 1, "team and unroll must be positive");
  using Acc = AccT<In>;
  using Vec = VecT<In>;
  constexpr int kL = kLanes<In>;
  // Elements past the last 16-byte boundary at or before p.
  const int misalign =
      static_cast<int>((reinterpret_cast<uintptr_t>(p) % kVecBytes) / sizeof(In));
  const int64_t head = misalign == 0 ? 0 : (kL - misalign < n ? kL - misalign : n);
  const int64_t body_vecs = (n - head) / kL;
  const int64_t tail_begin = head + body_vecs * kL;

  Acc scalar = Acc(0);
  if constexpr (kTeam >= kL - 1) {
    if (rank < head) scalar += ToAcc(LoadStreaming(p + rank));
    if (tail_begin + rank < n) scalar += ToAcc(LoadStreaming(p + tail_begin + rank));
  } else {
    for (int64_t k = rank; k < head; k += kTeam) scalar += ToAcc(LoadStreaming(p + k));
    for (int64_t k = tail_begin + rank; k < n; k += kTeam) scalar += ToAcc(LoadStreaming(p + k));
  }

  const Vec* body = reinterpret_cast<const Vec*>(p + head);
  Acc acc[kAccLanes<In>];
#pragma unroll
  for (int j = 0; j < kAccLanes<In>; ++j) acc[j] = Acc(0);
  int64_t i = rank;
  for (; i + static_cast<int64_t>(kUnroll - 1) * kTeam < body_vecs; i += kUnroll * kTeam) {
    Vec v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) v[j] = LoadStreaming(body + i + j * kTeam);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) AddVec<In>(acc, v[j]);
  }
  {
    Vec v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t idx = i + j * kTeam;
      v[j] = idx < body_vecs ? LoadStreaming(body + idx) : ZeroVec<In>();
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) AddVec<In>(acc, v[j]);
  }
  return TreeSum(acc) + scalar;
}

// bf16 crosses the API as raw bits; the kernels read __nv_bfloat16. Other types pass as they are.
inline const __nv_bfloat16* DeviceIn(const bf16_bits* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
template <typename T>
const T* DeviceIn(const T* p) {
  return p;
}

}  // namespace opserve::kernels::row_reduce

// The public overloads of a row-reduce launcher (every (In, Out) pair of kernels/row_reduce.h),
// each forwarding to the file's one generic `Impl`.
#define OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, In, Out)                                       \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out, int64_t rows, \
                   int64_t cols, bool mean, cudaStream_t stream) {                             \
    return Impl(d_temp, temp_bytes, row_reduce::DeviceIn(d_in), d_out, rows, cols, mean,       \
                stream);                                                                       \
  }
#define OPSERVE_ROW_REDUCE_OVERLOADS(Name, Impl)                \
  OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, float, float)         \
  OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, bf16_bits, float)     \
  OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, int32_t, int64_t)     \
  OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, int64_t, int64_t)     \
  OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, int32_t, float)       \
  OPSERVE_ROW_REDUCE_OVERLOAD(Name, Impl, int64_t, float)
