// The device side of the reduction operators (kernels/reduce.h): for each operator, what an input
// element accumulates in, the identity, the combine and how an accumulator becomes an output.
// Every kernel of the family (reduce_*.cuh, row_reduce_*.cuh) is written against these alone, so
// sum, max and min run the same loads, unroll and grids.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/reduce.h"

namespace opserve::kernels::reduce {

// ---- Accumulators ----
// Sum: float in float; bf16 in float (its 8-bit mantissa would lose a long sum); int32 exactly in
// int64; int64 in int64, wrapping modulo 2^64 as numpy's int64 sum does (two's complement add;
// any order of wrapping adds gives the same residue).
// Max / Min: each type in itself, but bf16 in float: widening is exact and the result is one of
// the inputs, so narrowing it back is exact too (ToOut), and float has the NaN-propagating
// max.NaN / min.NaN instructions for one element at a time.
// Acc<Op, Acc> is Acc again for every accumulator, so a second pass can read the partials as
// its input.
template <typename Op, typename T>
struct AccOf {
  using type = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, float, T>;
};
template <typename T>
struct AccOf<Sum, T> {
  using type = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, float,
                                  std::conditional_t<std::is_integral_v<T>, int64_t, T>>;
};
template <typename T>
struct AccOf<Mean, T> : AccOf<Sum, T> {};
template <typename Op, typename T>
using AccT = typename AccOf<Op, T>::type;

// One input element in its accumulator type. bf16 -> float is exact (the float's top 16 bits).
template <typename Op, typename T>
__device__ __forceinline__ AccT<Op, T> ToAcc(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return static_cast<AccT<Op, T>>(v);
  }
}

// ---- Combine and identity ----
template <typename Op>
struct Operator;

template <>
struct Operator<Sum> {
  template <typename A>
  static __host__ __device__ __forceinline__ A Identity() {
    return A(0);
  }
  template <typename A>
  static __device__ __forceinline__ A Combine(A a, A b) {
    return a + b;
  }
};
template <>
struct Operator<Mean> : Operator<Sum> {};

// NaN-propagating, order-independent: max.NaN / min.NaN (sm_80) give the canonical NaN when
// either input is NaN and order -0.0 below +0.0, so the result's bits never depend on the
// combining order. fmaxf would drop the NaN instead.
__device__ __forceinline__ float MaxNaN(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float MinNaN(float a, float b) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

template <>
struct Operator<Max> {
  // Below every value: -inf, or the type's lowest integer.
  template <typename A>
  static __host__ __device__ __forceinline__ A Identity() {
    if constexpr (std::is_floating_point_v<A>) {
      return -std::numeric_limits<A>::infinity();
    } else {
      return std::numeric_limits<A>::lowest();
    }
  }
  static __device__ __forceinline__ float Combine(float a, float b) { return MaxNaN(a, b); }
  static __device__ __forceinline__ int32_t Combine(int32_t a, int32_t b) { return max(a, b); }
  static __device__ __forceinline__ int64_t Combine(int64_t a, int64_t b) {
    return a > b ? a : b;
  }
};

template <>
struct Operator<Min> {
  template <typename A>
  static __host__ __device__ __forceinline__ A Identity() {
    if constexpr (std::is_floating_point_v<A>) {
      return std::numeric_limits<A>::infinity();
    } else {
      return std::numeric_limits<A>::max();
    }
  }
  static __device__ __forceinline__ float Combine(float a, float b) { return MinNaN(a, b); }
  static __device__ __forceinline__ int32_t Combine(int32_t a, int32_t b) { return min(a, b); }
  static __device__ __forceinline__ int64_t Combine(int64_t a, int64_t b) {
    return a < b ? a : b;
  }
};

template <typename Op, typename A>
__host__ __device__ __forceinline__ A Identity() {
  return Operator<Op>::template Identity<A>();
}
template <typename Op, typename A>
__device__ __forceinline__ A Combine(A a, A b) {
  return Operator<Op>::Combine(a, b);
}

// The identity as an input element: what padding lanes of a vector hold, so they change nothing.
// bf16: the float identity's top half, exact for each one (0, -inf, +inf have zero low halves;
// it widens back to the float identity), and a constant that folds, where __float2bfloat16_rn is
// an inline-asm cvt the compiler cannot fold: a conversion and a branch per padded vector.
template <typename Op, typename T>
__device__ __forceinline__ T IdentityIn() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const unsigned int bits = __float_as_uint(Identity<Op, float>());
    return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
  } else {
    return Identity<Op, T>();
  }
}

// An accumulator as the output type. bf16 output (its raw bits) comes from a max or min, whose
// float accumulator holds a widened bf16 or the canonical NaN: its top half is exact (0x7FFF for
// the NaN). Every other output is the accumulator, or an exact integer widening.
// (CUB's segmented reduce also passes its initial value through a row's transform output
// iterator, already as the output type: that passes unchanged.)
template <typename Out, typename A>
__device__ __forceinline__ Out ToOut(A a) {
  if constexpr (std::is_same_v<Out, A>) {
    return a;
  } else if constexpr (std::is_same_v<Out, bf16_bits>) {
    static_assert(std::is_same_v<A, float>, "a bf16 output is a float accumulator narrowed");
    return static_cast<bf16_bits>(__float_as_uint(a) >> 16);
  } else {
    return static_cast<Out>(a);
  }
}

// The operator as a functor over one accumulator type, for CUB: CUB's accumulator is what
// op(init, item) returns, so a narrower item (bf16, int32 under Sum) converts on the way in.
template <typename Op, typename A>
struct CombineFn {
  __device__ __forceinline__ A operator()(A a, A b) const { return Combine<Op>(a, b); }
};

}  // namespace opserve::kernels::reduce
