// row_sum / row_mean through cub::DeviceSegmentedReduce: the library baseline.
//
// Row r is the segment [r * cols, (r + 1) * cols). The offsets are computed, never stored: a
// counting iterator mapped through "times cols" (int64, so rows * cols may pass 2^31), with the
// end offsets the same sequence shifted by one. What each row's sum becomes (the mean's 1/cols, or
// an integer mean's division) is applied as CUB writes it, through a transform output iterator,
// so there is no second pass over d_out.
// Accumulators: FLOAT32 sums with DeviceSegmentedReduce::Sum; BFLOAT16 and INT32 go through
// DeviceSegmentedReduce::Reduce with a float32 (bf16) or int64 (int32) initial value and an add
// over that type, which makes it CUB's accumulator type; INT64 sums in int64. The input stays a
// raw pointer in every case, so CUB keeps its vectorized loads.
// CUB (CCCL 3.0, CUDA 13) launches one 256-thread block per segment; deterministic.
#include <cub/device/device_segmented_reduce.cuh>
#include <cuda_bf16.h>
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

// The accumulator's add. CUB's accumulator type is what op(init, item) returns, so an add over
// float with a float initial value accumulates bf16 rows in float32, and one over int64 with an
// int64 initial value accumulates int32 rows exactly.
template <typename Acc>
struct AddAs {
  __host__ __device__ Acc operator()(Acc a, Acc b) const { return a + b; }
};

// Float sums (FLOAT32, BFLOAT16): times OutputScale (1 for a sum, 1/cols for a mean).
struct Scale {
  float scale;
  __host__ __device__ float operator()(float sum) const { return sum * scale; }
};

// Integer means: the exact int64 sum divided by cols in double, rounded once to float.
struct IntMean {
  int64_t cols;
  __host__ __device__ float operator()(int64_t sum) const {
    return static_cast<float>(static_cast<double>(sum) / static_cast<double>(cols));
  }
};

// Rows <= 0 or cols <= 0: nothing to launch (a size query reports 0 bytes).
bool Empty(void* d_temp, size_t* temp_bytes, int64_t rows, int64_t cols) {
  if (rows > 0 && cols > 0) return false;
  if (d_temp == nullptr) *temp_bytes = 0;
  return true;
}

auto BeginOffsets(int64_t cols) {
  return thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0), RowOffset{cols});
}

// One DeviceSegmentedReduce::Reduce over the rows, accumulating in Acc.
template <typename Acc, typename In, typename Out>
cudaError_t ReduceRows(void* d_temp, size_t* temp_bytes, const In* d_in, Out out, int64_t rows,
                       int64_t cols, cudaStream_t stream) {
  const auto begin_offsets = BeginOffsets(cols);
  // With d_temp == nullptr CUB only writes the size it needs, as the convention asks.
  const cudaError_t err =
      cub::DeviceSegmentedReduce::Reduce(d_temp, *temp_bytes, d_in, out, rows, begin_offsets,
                                         begin_offsets + 1, AddAs<Acc>{}, Acc(0), stream);
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

// Integer inputs: exact int64 row sums (mean must be false) or means (mean must be true).
template <typename In>
cudaError_t IntRowSums(void* d_temp, size_t* temp_bytes, const In* d_in, int64_t* d_out,
                       int64_t rows, int64_t cols, bool mean, cudaStream_t stream) {
  if (mean) return cudaErrorInvalidValue;
  if (Empty(d_temp, temp_bytes, rows, cols)) return cudaSuccess;
  return ReduceRows<int64_t>(d_temp, temp_bytes, d_in, d_out, rows, cols, stream);
}

template <typename In>
cudaError_t IntRowMeans(void* d_temp, size_t* temp_bytes, const In* d_in, float* d_out,
                        int64_t rows, int64_t cols, bool mean, cudaStream_t stream) {
  if (!mean) return cudaErrorInvalidValue;
  if (Empty(d_temp, temp_bytes, rows, cols)) return cudaSuccess;
  return ReduceRows<int64_t>(d_temp, temp_bytes, d_in,
                             thrust::make_transform_output_iterator(d_out, IntMean{cols}), rows,
                             cols, stream);
}

}  // namespace

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const float* d_in,
                                  float* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  if (Empty(d_temp, temp_bytes, rows, cols)) return cudaSuccess;
  const auto begin_offsets = BeginOffsets(cols);
  const auto out =
      thrust::make_transform_output_iterator(d_out, Scale{row_reduce::OutputScale(cols, mean)});
  // With d_temp == nullptr CUB only writes the size it needs, as the convention asks.
  const cudaError_t err = cub::DeviceSegmentedReduce::Sum(d_temp, *temp_bytes, d_in, out, rows,
                                                          begin_offsets, begin_offsets + 1, stream);
  if (err != cudaSuccess) return err;
  return LastLaunchError();
}

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const bf16_bits* d_in,
                                  float* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  if (Empty(d_temp, temp_bytes, rows, cols)) return cudaSuccess;
  return ReduceRows<float>(
      d_temp, temp_bytes, reinterpret_cast<const __nv_bfloat16*>(d_in),
      thrust::make_transform_output_iterator(d_out, Scale{row_reduce::OutputScale(cols, mean)}),
      rows, cols, stream);
}

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const int32_t* d_in,
                                  int64_t* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  return IntRowSums(d_temp, temp_bytes, d_in, d_out, rows, cols, mean, stream);
}

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const int64_t* d_in,
                                  int64_t* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  return IntRowSums(d_temp, temp_bytes, d_in, d_out, rows, cols, mean, stream);
}

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const int32_t* d_in,
                                  float* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  return IntRowMeans(d_temp, temp_bytes, d_in, d_out, rows, cols, mean, stream);
}

cudaError_t RowReduceCubSegmented(void* d_temp, size_t* temp_bytes, const int64_t* d_in,
                                  float* d_out, int64_t rows, int64_t cols, bool mean,
                                  cudaStream_t stream) {
  return IntRowMeans(d_temp, temp_bytes, d_in, d_out, rows, cols, mean, stream);
}

}  // namespace opserve::kernels
