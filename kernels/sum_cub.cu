// sum, cub: cub::DeviceReduce (CUB's own two-pass reduce agent; on sm_90 it picks its Policy600:
// 256 threads, 16 items per thread as four 16-byte loads, up to 5 waves of blocks, then a
// single-tile pass). float: DeviceReduce::Sum. int32 -> int64: TransformReduce that widens each
// element to int64 before adding, so the sum is exact. int64: DeviceReduce::Sum in int64 (an
// overflow wraps, as numpy's does). bf16 -> float: TransformReduce that widens each element to
// float, so CUB accumulates in float32, not in bf16. The input stays a raw pointer in every case,
// so CUB keeps its vectorized loads. CUB documents all of these as run-to-run deterministic on one
// device.
#include <cub/device/device_reduce.cuh>
#include <cuda_bf16.h>
#include <cuda/std/functional>

#include <cstdint>
#include <limits>

#include "kernels/sum.h"

namespace opserve::kernels {
namespace {

struct WidenToInt64 {
  __host__ __device__ __forceinline__ int64_t operator()(int32_t x) const {
    return static_cast<int64_t>(x);
  }
};

struct WidenToFloat {
  __device__ __forceinline__ float operator()(__nv_bfloat16 x) const { return __bfloat162float(x); }
};

// CUB picks its offset type from num_items' type: a 32-bit type gets 32-bit offsets (its common,
// cheapest-indexing path), a 64-bit type 64-bit offsets. So pass int32 while n fits it and int64
// beyond (n >= 2^31), rather than int64 always.
template <typename Reduce>
cudaError_t WithNumItems(int64_t n, Reduce&& reduce) {
  if (n <= std::numeric_limits<int32_t>::max()) return reduce(static_cast<int32_t>(n));
  return reduce(n);
}

}  // namespace

cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out, int64_t n,
                   cudaStream_t stream) {
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  const cudaError_t err = WithNumItems(n, [&](auto num_items) {
    return cub::DeviceReduce::Sum(d_temp, *temp_bytes, d_in, d_out, num_items, stream);
  });
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                   int64_t n, cudaStream_t stream) {
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  const cudaError_t err = WithNumItems(n, [&](auto num_items) {
    return cub::DeviceReduce::TransformReduce(d_temp, *temp_bytes, d_in, d_out, num_items,
                                              ::cuda::std::plus<int64_t>{}, WidenToInt64{},
                                              int64_t{0}, stream);
  });
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,
                   int64_t n, cudaStream_t stream) {
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  const cudaError_t err = WithNumItems(n, [&](auto num_items) {
    return cub::DeviceReduce::Sum(d_temp, *temp_bytes, d_in, d_out, num_items, stream);
  });
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

cudaError_t SumCub(void* d_temp, size_t* temp_bytes, const bf16_bits* d_in, float* d_out,
                   int64_t n, cudaStream_t stream) {
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  const auto* in = reinterpret_cast<const __nv_bfloat16*>(d_in);
  const cudaError_t err = WithNumItems(n, [&](auto num_items) {
    return cub::DeviceReduce::TransformReduce(d_temp, *temp_bytes, in, d_out, num_items,
                                              ::cuda::std::plus<float>{}, WidenToFloat{}, 0.0f,
                                              stream);
  });
  if (err != cudaSuccess || d_temp == nullptr) return err;
  return LastLaunchError();
}

}  // namespace opserve::kernels
