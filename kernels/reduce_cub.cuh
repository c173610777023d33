// cub: cub::DeviceReduce (CUB's own two-pass reduce agent; on sm_90 it picks its Policy600: 256
// threads, 16 items per thread as four 16-byte loads, up to 5 waves of blocks, then a
// single-tile pass), with the operator's functor.
//   Sum: FLOAT32 and INT64 through DeviceReduce::Sum (an int64 overflow wraps, as numpy's does);
//     INT32 -> INT64 and BFLOAT16 -> FLOAT32 through TransformReduce with a widening transform,
//     so CUB accumulates in the output type (exactly for int32, in float32 for bf16).
//   Max / Min: DeviceReduce::Reduce with reduce_op.cuh's NaN-propagating functor and identity;
//     BFLOAT16 through TransformReduce widening to float, narrowed back exactly as CUB writes it.
// The input stays a raw pointer in every case, so CUB keeps its vectorized loads. CUB documents
// all of these as run-to-run deterministic on one device.
#pragma once

#include <cub/device/device_reduce.cuh>
#include <cuda_bf16.h>
#include <cuda/std/functional>
#include <thrust/iterator/transform_output_iterator.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/reduce.h"
#include "kernels/reduce_common.cuh"

namespace opserve::kernels {
namespace cub_reduce {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using reduce::AccT;

// One element in the operator's accumulator type (int32 -> int64 for Sum, bf16 -> float).
template <typename Op, typename T>
struct ToAccFn {
  __device__ __forceinline__ AccT<Op, T> operator()(T x) const { return reduce::ToAcc<Op>(x); }
};

// The accumulator as the output type, as CUB writes it (bf16 max / min: the exact narrowing).
template <typename Out>
struct ToOutFn {
  template <typename A>
  __device__ __forceinline__ Out operator()(A a) const {
    return reduce::ToOut<Out>(a);
  }
};

// CUB picks its offset type from num_items' type: a 32-bit type gets 32-bit offsets (its common,
// cheapest-indexing path), a 64-bit type 64-bit offsets. So pass int32 while n fits it and int64
// beyond (n >= 2^31), rather than int64 always.
template <typename Reduce>
cudaError_t WithNumItems(int64_t n, Reduce&& reduce) {
  if (n <= std::numeric_limits<int32_t>::max()) return reduce(static_cast<int32_t>(n));
  return reduce(n);
}

// Sum keeps CUB's own plus, so its path is exactly DeviceReduce::Sum's.
template <typename Op, typename A>
auto CubOp() {
  if constexpr (std::is_same_v<Op, Sum>) {
    return ::cuda::std::plus<A>{};
  } else {
    return reduce::CombineFn<Op, A>{};
  }
}

template <typename Op, typename T, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                 cudaStream_t stream) {
  using Acc = AccT<Op, T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  const cudaError_t err = WithNumItems(n, [&](auto num_items) {
    if constexpr (std::is_same_v<Op, Sum> && std::is_same_v<T, Acc>) {
      return cub::DeviceReduce::Sum(d_temp, *temp_bytes, d_in, d_out, num_items, stream);
    } else if constexpr (std::is_same_v<T, Acc>) {
      return cub::DeviceReduce::Reduce(d_temp, *temp_bytes, d_in, d_out, num_items,
                                       CubOp<Op, Acc>(), reduce::Identity<Op, Acc>(), stream);
    } else if constexpr (std::is_same_v<Out, Acc>) {
      return cub::DeviceReduce::TransformReduce(d_temp, *temp_bytes, d_in, d_out, num_items,
                                                CubOp<Op, Acc>(), ToAccFn<Op, T>{},
                                                reduce::Identity<Op, Acc>(), stream);
    } else {
      return cub::DeviceReduce::TransformReduce(
          d_temp, *temp_bytes, d_in, thrust::make_transform_output_iterator(d_out, ToOutFn<Out>{}),
          num_items, CubOp<Op, Acc>(), ToAccFn<Op, T>{}, reduce::Identity<Op, Acc>(), stream);
    }
  });
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

}  // namespace
}  // namespace cub_reduce

OPSERVE_DEFINE_REDUCE_ALL(ReduceCub, cub_reduce::Impl)

}  // namespace opserve::kernels
