// Private helpers shared by the row reductions (kernels/row_reduce_*.cuh: [rows, cols] of FLOAT32,
// BFLOAT16, INT32 or INT64 -> [rows]), written against an operator (reduce_op.cuh). Not part of
// the kernel layer's public surface.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/bf16_words.cuh"
#include "kernels/common.h"
#include "kernels/reduce.h"
#include "kernels/reduce_op.cuh"

namespace opserve::kernels::row_reduce {

using reduce::AccT;
using reduce::Combine;
using reduce::Identity;

constexpr int kWarpSize = 32;

// Host: what a float-accumulated mean (FLOAT32 and BFLOAT16 inputs) is multiplied by: 1/cols
// rounded once from double, so one rounding step more than a division, far under any float32
// tolerance, and a multiply instead of a divide per row.
inline float MeanScale(int64_t cols) { return static_cast<float>(1.0 / static_cast<double>(cols)); }

// Host: multiprocessor count of the current device (grid sizing only).
inline cudaError_t CurrentSmCount(int* sm_count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

// ---- Element types ----
// Each input type's 16-byte vector (bf16 as 8 raw halves in a uint4) and the vector's lane count.
// The accumulator is the operator's (reduce_op.cuh: AccT).
template <typename In>
struct Elem;
template <>
struct Elem<float> {
  using Vec = float4;
};
template <>
struct Elem<__nv_bfloat16> {
  using Vec = uint4;
};
template <>
struct Elem<int32_t> {
  using Vec = int4;
};
template <>
struct Elem<int64_t> {
  using Vec = longlong2;
};
template <typename In>
using VecT = typename Elem<In>::Vec;

constexpr int kVecBytes = 16;
template <typename In>
inline constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(In));
static_assert(sizeof(float4) == kVecBytes && sizeof(uint4) == kVecBytes &&
              sizeof(int4) == kVecBytes && sizeof(longlong2) == kVecBytes);

// ---- What each output is made of its row's accumulator ----
// Sum, Max, Min: the accumulator as the output type (reduce_op.cuh's ToOut; exact).
template <typename Op, typename Out>
struct RowFinish {
  static RowFinish Make(int64_t /*cols*/) { return {}; }
  template <typename Acc>
  __device__ __forceinline__ Out operator()(Acc total) const {
    return reduce::ToOut<Out>(total);
  }
};
// Integer row_mean: the exact int64 sum divided by cols in double, rounded once to float.
// Out of line: the double division (Newton steps and a slow path) inlined into warp_per_row's
// pipelined short-row kernel spilled at its 64-register cap; it runs once per row.
__device__ __noinline__ inline float IntRowMean(int64_t sum, int64_t cols) {
  return static_cast<float>(static_cast<double>(sum) / static_cast<double>(cols));
}
// Mean: a float sum times MeanScale; an integer row's exact sum divided by cols (IntRowMean).
template <>
struct RowFinish<Mean, float> {
  float scale;
  int64_t cols;
  static RowFinish Make(int64_t cols) { return {MeanScale(cols), cols}; }
  __device__ __forceinline__ float operator()(float sum) const { return sum * scale; }
  __device__ __forceinline__ float operator()(int64_t sum) const { return IntRowMean(sum, cols); }
};
// The partials of a split row: the accumulator as it is (the second pass applies the real finish).
struct Keep {
  template <typename Acc>
  __device__ __forceinline__ Acc operator()(Acc total) const {
    return total;
  }
};

// ---- Loads and lane arithmetic ----
// The one place where input is read, so a cache hint can be tried in one line. LDG through the
// read-only path, as CUB's LOAD_LDG does: every byte is read exactly once.
template <typename T>
__device__ __forceinline__ T LoadStreaming(const T* p) {
  return __ldg(p);
}

// What a lane past the end of a row holds: the operator's identity, so it changes nothing (zero
// for a sum).
template <typename Op, typename In>
__device__ __forceinline__ In PadElem() {
  return reduce::IdentityIn<Op, In>();
}

template <typename Op, typename In>
__device__ __forceinline__ VecT<In> PadVec() {
  VecT<In> v;
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    const unsigned int half = __bfloat16_as_ushort(PadElem<Op, In>());
    v.x = v.y = v.z = v.w = (half << 16) | half;
  } else {
    const In pad = PadElem<Op, In>();
    v.x = pad;
    v.y = pad;
    if constexpr (kLanes<In> != 2) {  // longlong2 has no z, w
      v.z = pad;
      v.w = pad;
    }
  }
  return v;
}

// Calls f(std::integral_constant<int, i>{}) for i = 0, 1, ..., kN - 1, in that order: an unrolled
// loop whose index is a constant expression, so each lane is named (v.x, v.y...) at compile time.
// (A runtime index picking the lane through selects folds too, but the selects are still there
// when LLVM sizes the enclosing body loop for runtime unrolling, and it then unrolls it less.)
template <int kN, typename F>
__device__ __forceinline__ void StaticFor(F&& f) {
  [&]<int... i>(std::integer_sequence<int, i...>) {
    (f(std::integral_constant<int, i>{}), ...);
  }(std::make_integer_sequence<int, kN>{});
}

// Component k of a 16-byte vector: x, y, z, w in address order.
template <int k, typename V>
__device__ __forceinline__ auto Component(const V& v) {
  static_assert(k >= 0 && k < 4, "x, y, z or w");
  if constexpr (k == 0) {
    return v.x;
  } else if constexpr (k == 1) {
    return v.y;
  } else if constexpr (k == 2) {
    return v.z;
  } else {
    return v.w;
  }
}

// Lane k of one vector, in the accumulator type (bf16: half k % 2 of 32-bit word k / 2).
template <typename Op, typename In, int k>
__device__ __forceinline__ AccT<Op, In> LaneToAcc(const VecT<In>& v) {
  static_assert(k >= 0 && k < kLanes<In>, "a lane of the vector");
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    const unsigned int w = Component<k / 2>(v);
    if constexpr (k % 2 == 0) {
      return Bf16Lo(w);
    } else {
      return Bf16Hi(w);
    }
  } else {
    return Component<k>(v);
  }
}

// The kLanes elements of one vector, in address order, in the accumulator type.
template <typename Op, typename In>
__device__ __forceinline__ void VecToAcc(const VecT<In>& v, AccT<Op, In> (&a)[kLanes<In>]) {
  StaticFor<kLanes<In>>([&](auto k) { a[k] = LaneToAcc<Op, In, k>(v); });
}

// Pairwise combine of neighbours, level by level: ((a0 + a1) + (a2 + a3)) + ... A fixed shape.
template <typename Op, int kN, typename Acc>
__device__ __forceinline__ Acc Tree(Acc (&a)[kN]) {
  static_assert(kN >= 1 && (kN & (kN - 1)) == 0, "a power of two");
#pragma unroll
  for (int width = 1; width < kN; width *= 2) {
#pragma unroll
    for (int i = 0; i + width < kN; i += 2 * width) a[i] = Combine<Op>(a[i], a[i + width]);
  }
  return a[0];
}

// A thread's running accumulators over 16-byte vectors. float: one per lane (4), which keeps each
// float rounding chain short. bf16: one per 32-bit word (4), its two halves combined first. 8-byte
// accumulators (int64; int32 under Sum, exact in any order) keep 2 (4 registers; 4 int64 sums
// would spill the int32 warp kernel at the 64-register cap); int32 under Max / Min keeps 4.
template <typename Op, typename In>
inline constexpr int kAccLanes = sizeof(AccT<Op, In>) == 8 ? 2 : 4;

// Folds one vector into the running accumulators: lane j into acc[j], or lanes 2j and 2j + 1,
// combined first, where there are half as many accumulators as lanes.
// Pairs (int32 under Sum, bf16) convert each pair just before its combine, per pair cvt, cvt, add,
// add as the hand-written int32 sum did; all lanes converted first (VecToAcc) made nvcc group the
// cvt.s64.s32 / add.s64 of the unrolled loop differently, and block_per_row's INT32 row_sum
// measured 3% slower on an H200. Lanes keep VecToAcc and a plain loop: the StaticFor form there
// makes LLVM runtime-unroll the body loop further (INT32 max / min twice, at 64 registers instead
// of 48), which nothing has measured to pay.
template <typename Op, typename In>
__device__ __forceinline__ void AddVec(AccT<Op, In> (&acc)[kAccLanes<Op, In>], const VecT<In>& v) {
  constexpr int kL = kLanes<In>, kA = kAccLanes<Op, In>;
  static_assert(kL == kA || kL == 2 * kA, "a lane or a pair of lanes per accumulator");
  if constexpr (kL == kA) {
    AccT<Op, In> a[kL];
    VecToAcc<Op, In>(v, a);
#pragma unroll
    for (int j = 0; j < kA; ++j) acc[j] = Combine<Op>(acc[j], a[j]);
  } else {
    StaticFor<kA>([&](auto j) {
      const AccT<Op, In> lo = LaneToAcc<Op, In, 2 * j>(v);
      const AccT<Op, In> hi = LaneToAcc<Op, In, 2 * j + 1>(v);
      acc[j] = Combine<Op>(acc[j], Combine<Op>(lo, hi));
    });
  }
}

// ---- Warp and block reductions ----
// Butterfly over aligned groups of kGroup lanes (a power of two <= 32). Every lane of the warp
// must call it (full mask); every lane of a group ends with the group's result. The tree shape
// is fixed, so the result is deterministic.
template <typename Op, int kGroup, typename Acc>
__device__ __forceinline__ Acc GroupReduce(Acc v) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0,
                "group must be a power of two within a warp");
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
    v = Combine<Op>(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <typename Op, typename Acc>
__device__ __forceinline__ Acc WarpReduce(Acc v) {
  return GroupReduce<Op, kWarpSize>(v);
}

// Block-wide reduction; the result is valid in thread 0 only. Ends with no barrier pending, but a
// caller that calls it again must __syncthreads() in between (warp_totals is reused).
template <typename Op, int kThreads, typename Acc>
__device__ __forceinline__ Acc BlockReduce(Acc v) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024");
  v = WarpReduce<Op>(v);
  if constexpr (kThreads == kWarpSize) {
    return v;
  } else {
    constexpr int kWarps = kThreads / kWarpSize;
    __shared__ Acc warp_totals[kWarps];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    if (lane == 0) warp_totals[warp] = v;
    __syncthreads();
    v = Identity<Op, Acc>();
    if (warp == 0) {
      v = lane < kWarps ? warp_totals[lane] : Identity<Op, Acc>();
      v = WarpReduce<Op>(v);
    }
    return v;
  }
}

// This thread's share of the reduction of p[0, n), for a team of kTeam threads in which this one
// is `rank` (0 <= rank < kTeam). Any alignment of p to its element size: a scalar head up to the
// first 16-byte boundary, then 16-byte vector loads, then a scalar tail (head and tail each
// shorter than one vector: 3 floats or int32, 7 bf16, 1 int64).
// Body loads go kUnroll at a time, all issued before any is combined, so a thread has up to
// kUnroll 16-byte loads in flight; the last partial round is predicated (padding lanes hold the
// identity), not a scalar loop, so short ranges still issue their loads together. Accumulation:
// kAccLanes running accumulators per thread, then the caller's tree, so each float running sum
// sees about n / (4 * kTeam) terms.
template <typename Op, int kTeam, int kUnroll, typename In>
__device__ __forceinline__ AccT<Op, In> TeamPartial(const In* __restrict__ p, int64_t n,
                                                    int rank) {
  static_assert(kTeam >= 1 && kUnroll >= 1, "team and unroll must be positive");
  using Acc = AccT<Op, In>;
  using Vec = VecT<In>;
  constexpr int kL = kLanes<In>;
  // Elements past the last 16-byte boundary at or before p.
  const int misalign =
      static_cast<int>((reinterpret_cast<uintptr_t>(p) % kVecBytes) / sizeof(In));
  const int64_t head = misalign == 0 ? 0 : (kL - misalign < n ? kL - misalign : n);
  const int64_t body_vecs = (n - head) / kL;
  const int64_t tail_begin = head + body_vecs * kL;

  Acc scalar = Identity<Op, Acc>();
  auto take = [&](const In* q) {
    scalar = Combine<Op>(scalar, reduce::ToAcc<Op>(LoadStreaming(q)));
  };
  if constexpr (kTeam >= kL - 1) {
    if (rank < head) take(p + rank);
    if (tail_begin + rank < n) take(p + tail_begin + rank);
  } else {
    for (int64_t k = rank; k < head; k += kTeam) take(p + k);
    for (int64_t k = tail_begin + rank; k < n; k += kTeam) take(p + k);
  }

  const Vec* body = reinterpret_cast<const Vec*>(p + head);
  Acc acc[kAccLanes<Op, In>];
#pragma unroll
  for (int j = 0; j < kAccLanes<Op, In>; ++j) acc[j] = Identity<Op, Acc>();
  int64_t i = rank;
  for (; i + static_cast<int64_t>(kUnroll - 1) * kTeam < body_vecs; i += kUnroll * kTeam) {
    Vec v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) v[j] = LoadStreaming(body + i + j * kTeam);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) AddVec<Op, In>(acc, v[j]);
  }
  {
    Vec v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t idx = i + j * kTeam;
      v[j] = idx < body_vecs ? LoadStreaming(body + idx) : PadVec<Op, In>();
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) AddVec<Op, In>(acc, v[j]);
  }
  return Combine<Op>(Tree<Op>(acc), scalar);
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

// Defines one public overload of kernels/reduce.h (the row launcher `Name` for `In` inputs, a
// template over the operator) by forwarding to `Impl<Op>`, the algorithm's template over the
// device element type. Use inside namespace opserve::kernels.
#define OPSERVE_DEFINE_ROW_REDUCE(Name, Impl, In)                                           \
  template <typename Op>                                                                    \
  OPSERVE_ROW_REDUCE_SIGNATURE(Name, Op, In) {                                              \
    return Impl<Op>(d_temp, temp_bytes, row_reduce::DeviceIn(d_in), d_out, rows, cols, stream); \
  }
#define OPSERVE_DEFINE_ROW_REDUCE_ALL(Name, Impl) \
  OPSERVE_DEFINE_ROW_REDUCE(Name, Impl, float)    \
  OPSERVE_DEFINE_ROW_REDUCE(Name, Impl, int32_t)  \
  OPSERVE_DEFINE_ROW_REDUCE(Name, Impl, int64_t)  \
  OPSERVE_DEFINE_ROW_REDUCE(Name, Impl, bf16_bits)

// Explicit instantiations, for an op's .cu file (row_sum.cu, row_max.cu...): `Name` for
// operator `Op` over `In`, or over every input type. Use inside namespace opserve::kernels.
#define OPSERVE_INSTANTIATE_ROW_REDUCE(Name, Op, In) \
  template OPSERVE_ROW_REDUCE_SIGNATURE(Name<Op>, Op, In);
#define OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(Name, Op) \
  OPSERVE_INSTANTIATE_ROW_REDUCE(Name, Op, float)    \
  OPSERVE_INSTANTIATE_ROW_REDUCE(Name, Op, int32_t)  \
  OPSERVE_INSTANTIATE_ROW_REDUCE(Name, Op, int64_t)  \
  OPSERVE_INSTANTIATE_ROW_REDUCE(Name, Op, bf16_bits)
