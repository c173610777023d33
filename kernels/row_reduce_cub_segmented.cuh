// Row reduction through cub::DeviceSegmentedReduce: the library baseline.
//
// Row r is the segment [r * cols, (r + 1) * cols). The offsets are computed, never stored: a
// counting iterator mapped through "times cols" (int64, so rows * cols may pass 2^31), with the
// end offsets the same sequence shifted by one. What each row's accumulator becomes (a mean's
// 1/cols or an integer mean's division, a bf16 max's narrowing) is applied as CUB writes it,
// through a transform output iterator, so there is no second pass over d_out.
// Accumulators (reduce_op.cuh): FLOAT32 sums and means with DeviceSegmentedReduce::Sum; every
// other case goes through DeviceSegmentedReduce::Reduce with the operator's functor over its
// accumulator type and its identity as the initial value, which makes that type CUB's
// accumulator (float32 for bf16, int64 for int32 sums). The input stays a raw pointer in every
// case, so CUB keeps its vectorized loads. CUB (CCCL 3.0, CUDA 13) launches one 256-thread block
// per segment; deterministic. Included by the op files' instantiation .cu files (row_sum.cu,
// row_max.cu...).
#pragma once

#include <cub/device/device_segmented_reduce.cuh>
#include <cuda_bf16.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include <cstdint>
#include <type_traits>

#include "kernels/reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace cub_segmented {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

struct RowOffset {
  int64_t cols;
  __host__ __device__ int64_t operator()(int64_t row) const { return row * cols; }
};

// The accumulator's add for Sum. CUB's accumulator type is what op(init, item) returns, so an add
// over float with a float initial value accumulates bf16 rows in float32, and one over int64 with
// an int64 initial value accumulates int32 rows exactly. Other operators: reduce_op.cuh's functor,
// typed the same way.
template <typename Op, typename Acc>
struct CombineAs {
  __host__ __device__ Acc operator()(Acc a, Acc b) const { return a + b; }
};
template <typename Acc>
struct CombineAs<Max, Acc> : reduce::CombineFn<Max, Acc> {};
template <typename Acc>
struct CombineAs<Min, Acc> : reduce::CombineFn<Min, Acc> {};

// Rows <= 0 or cols <= 0: nothing to launch (a size query reports 0 bytes).
bool Empty(void* d_temp, size_t* temp_bytes, int64_t rows, int64_t cols) {
  if (rows > 0 && cols > 0) return false;
  if (d_temp == nullptr) *temp_bytes = 0;
  return true;
}

template <typename Op, typename In, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  using Acc = row_reduce::AccT<Op, In>;
  if (Empty(d_temp, temp_bytes, rows, cols)) return cudaSuccess;
  const auto begin_offsets =
      thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), RowOffset{cols});
  const auto finish = row_reduce::RowFinish<Op, Out>::Make(cols);
  // With d_temp == nullptr CUB only writes the size it needs, as the convention asks.
  cudaError_t err;
  if constexpr (std::is_same_v<Op, Sum> && std::is_same_v<In, float>) {
    err = cub::DeviceSegmentedReduce::Sum(d_temp, *temp_bytes, d_in, d_out, rows, begin_offsets,
                                          begin_offsets + 1, stream);
  } else if constexpr (std::is_same_v<Op, Mean> && std::is_same_v<In, float>) {
    err = cub::DeviceSegmentedReduce::Sum(d_temp, *temp_bytes, d_in,
                                          thrust::make_transform_output_iterator(d_out, finish),
                                          rows, begin_offsets, begin_offsets + 1, stream);
  } else if constexpr (std::is_same_v<Out, Acc> && !std::is_same_v<Op, Mean>) {
    err = cub::DeviceSegmentedReduce::Reduce(d_temp, *temp_bytes, d_in, d_out, rows,
                                             begin_offsets, begin_offsets + 1, CombineAs<Op, Acc>{},
                                             reduce::Identity<Op, Acc>(), stream);
  } else {
    err = cub::DeviceSegmentedReduce::Reduce(
        d_temp, *temp_bytes, d_in, thrust::make_transform_output_iterator(d_out, finish), rows,
        begin_offsets, begin_offsets + 1, CombineAs<Op, Acc>{}, reduce::Identity<Op, Acc>(),
        stream);
  }
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

}  // namespace
}  // namespace cub_segmented

OPSERVE_DEFINE_ROW_REDUCE_ALL(RowReduceCubSegmented, cub_segmented::Impl)

}  // namespace opserve::kernels
