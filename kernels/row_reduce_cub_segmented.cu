// row_sum / row_mean through cub::DeviceSegmentedReduce::Sum: the library baseline.
//
// Row r is the segment [r * cols, (r + 1) * cols). The offsets are computed, never stored: a
// counting iterator mapped through "times cols" (int64, so rows * cols may pass 2^31), with the
// end offsets the same sequence shifted by one. The mean's 1/cols is applied as CUB writes each
// result, through a transform output iterator, so there is no second pass over d_out.
// CUB (CCCL 3.0, CUDA 13) launches one 256-thread block per segment; deterministic.
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include <cstdint>

#include "kernels/row_reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace {

struct RowOffset {
  int64_t cols;
  __host__ __device__ int64_t operator()(int64_t row) const { return row * cols; }
};

struct Scale {
  float scale;
  __host__ __device__ float operator()(float sum) const { return sum * scale; }
};

}  // namespace

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const float* d_in,
                                  float* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) {
    if (d_temp == nullptr) *temp_bytes = 0;
    return cudaSuccess;
  }
  const auto begin_offsets = thrust::make_transform_iterator(
      thrust::counting_iterator<int64_t>(0), RowOffset{cols});
  const auto end_offsets = begin_offsets + 1;
  const auto out =
      thrust::make_transform_output_iterator(d_out, Scale{row_reduce::OutputScale(cols, mean)});
  // With d_temp == nullptr CUB only writes the size it needs, as the convention asks.
  const cudaError_t err = cub::DeviceSegmentedReduce::Sum(d_temp, *temp_bytes, d_in, out, rows,
                                                          begin_offsets, end_offsets, stream);
  if (err != cudaSuccess) return err;
  return LastLaunchError();
}

}  // namespace opserve::kernels
