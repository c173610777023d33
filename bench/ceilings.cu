// The ceilings of opserve-bench (ceilings.h): what a user would otherwise call, measured in the
// same run as the op table's kernels.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "bench/ceilings.h"

namespace opserve::bench {
namespace {

// The read stream is shaped like CUB's reduce agent and sum_vectorized: one resident wave of
// 256-thread blocks, 8 independent 16-byte loads per thread per round, each warp load one
// coalesced 512-byte segment (a first version with 4 loads a thread and 8 blocks per SM read only
// 4.0 TB/s on the H200, under CUB's 4.6: not a ceiling).
constexpr int kStreamThreads = 256;
constexpr int kStreamBlocksPerSm = 4;
constexpr int kStreamUnroll = 8;

__global__ void __launch_bounds__(kStreamThreads, kStreamBlocksPerSm)
    read_stream_kernel(const float4* __restrict__ in, int64_t n_vec, float* sink) {
  const int64_t threads = int64_t{gridDim.x} * kStreamThreads;
  const int64_t g = blockIdx.x * int64_t{kStreamThreads} + threadIdx.x;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  int64_t base = 0;
  for (; base + kStreamUnroll * threads <= n_vec; base += kStreamUnroll * threads) {
    float4 v[kStreamUnroll];
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) v[u] = __ldg(in + base + u * threads + g);
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) {
      acc.x += v[u].x;
      acc.y += v[u].y;
      acc.z += v[u].z;
      acc.w += v[u].w;
    }
  }
#pragma unroll
  for (int u = 0; u < kStreamUnroll; ++u) {  // the partial last round, guarded
    const int64_t i = base + u * threads + g;
    if (i < n_vec) {
      const float4 v = __ldg(in + i);
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
  }
  // Never true for finite inputs in [-1, 1): the write keeps the loads alive.
  if (acc.x + acc.y + acc.z + acc.w == 1.0e30f) *sink = acc.x;
}

struct RowOffset {
  int64_t cols;
  __host__ __device__ int64_t operator()(int64_t row) const { return row * cols; }
};

struct Widen {
  __host__ __device__ int64_t operator()(int32_t v) const { return v; }
};

struct WidenBf16 {
  __device__ float operator()(__nv_bfloat16 v) const { return __bfloat162float(v); }
};

// An add over Acc: with an Acc initial value it makes Acc CUB's accumulator type.
template <typename Acc>
struct AddAs {
  __host__ __device__ Acc operator()(Acc a, Acc b) const { return a + b; }
};

const __nv_bfloat16* AsBf16(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

cudaError_t FromBlas(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

}  // namespace

cudaError_t CopyD2D(void* d_dst, const void* d_src, size_t bytes, cudaStream_t stream) {
  return cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t ReadStream(const float* d_in, int64_t n, float* d_sink, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // A grid no larger than the work: small reads should not pay for idle blocks.
  const int64_t n_vec = n / 4;
  const int64_t wanted = (n_vec + int64_t{kStreamThreads} * kStreamUnroll - 1) /
                         (int64_t{kStreamThreads} * kStreamUnroll);
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, sms * kStreamBlocksPerSm)));
  read_stream_kernel<<<grid, kStreamThreads, 0, stream>>>(reinterpret_cast<const float4*>(d_in),
                                                         n_vec, d_sink);
  return cudaPeekAtLastError();
}

cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                         int64_t n, cudaStream_t stream) {
  return cub::DeviceReduce::Sum(d_temp, *temp_bytes, d_in, d_out, n, stream);
}

cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                         int64_t n, cudaStream_t stream) {
  // Exact: widen each int32 to int64 before adding (Sum alone would add in int32 and overflow).
  return cub::DeviceReduce::TransformReduce(d_temp, *temp_bytes, d_in, d_out, n,
                                            cuda::std::plus<int64_t>{}, Widen{}, int64_t{0},
                                            stream);
}

cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,
                         int64_t n, cudaStream_t stream) {
  return cub::DeviceReduce::Sum(d_temp, *temp_bytes, d_in, d_out, n, stream);
}

cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const uint16_t* d_bf16, float* d_out,
                         int64_t n, cudaStream_t stream) {
  // Widen each bf16 to float before adding, so CUB accumulates in float32 (the op's own choice).
  return cub::DeviceReduce::TransformReduce(d_temp, *temp_bytes, AsBf16(d_bf16), d_out, n,
                                            cuda::std::plus<float>{}, WidenBf16{}, 0.0f, stream);
}

cudaError_t CubSegmentedSum(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  const auto begin = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                                     RowOffset{cols});
  return cub::DeviceSegmentedReduce::Sum(d_temp, *temp_bytes, d_in, d_out, rows, begin, begin + 1,
                                         stream);
}

cudaError_t CubSegmentedSum(void* d_temp, size_t* temp_bytes, const uint16_t* d_bf16, float* d_out,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  const auto begin = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                                     RowOffset{cols});
  return cub::DeviceSegmentedReduce::Reduce(d_temp, *temp_bytes, AsBf16(d_bf16), d_out, rows,
                                            begin, begin + 1, AddAs<float>{}, 0.0f, stream);
}

cudaError_t CubSegmentedSum(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  const auto begin = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                                     RowOffset{cols});
  return cub::DeviceSegmentedReduce::Reduce(d_temp, *temp_bytes, d_in, d_out, rows, begin,
                                            begin + 1, AddAs<int64_t>{}, int64_t{0}, stream);
}

Blas::~Blas() {
  if (pedantic_) cublasDestroy(static_cast<cublasHandle_t>(pedantic_));
  if (fast_) cublasDestroy(static_cast<cublasHandle_t>(fast_));
}

cudaError_t Blas::Init(cudaStream_t stream) {
  cublasHandle_t p = nullptr, f = nullptr;
  if (cublasCreate(&p) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  pedantic_ = p;
  if (cublasCreate(&f) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  fast_ = f;
  cudaError_t err = FromBlas(cublasSetMathMode(p, CUBLAS_PEDANTIC_MATH));
  if (err == cudaSuccess) err = FromBlas(cublasSetStream(p, stream));
  if (err == cudaSuccess) err = FromBlas(cublasSetStream(f, stream));
  return err;
}

cudaError_t Blas::Gemm(Precision precision, const void* d_a, const void* d_b, float* d_c,
                       int64_t m, int64_t n, int64_t k) {
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands, no transposes.
  const float one = 1.0f, zero = 0.0f;
  switch (precision) {
    case Precision::kFp32Pedantic:
      return FromBlas(cublasSgemm_64(static_cast<cublasHandle_t>(pedantic_), CUBLAS_OP_N,
                                     CUBLAS_OP_N, n, m, k, &one, static_cast<const float*>(d_b), n,
                                     static_cast<const float*>(d_a), k, &zero, d_c, n));
    case Precision::kTf32:
      return FromBlas(cublasGemmEx_64(static_cast<cublasHandle_t>(fast_), CUBLAS_OP_N, CUBLAS_OP_N,
                                      n, m, k, &one, d_b, CUDA_R_32F, n, d_a, CUDA_R_32F, k, &zero,
                                      d_c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                                      CUBLAS_GEMM_DEFAULT));
    case Precision::kBf16:
      return GemmBf16OnHandle(fast_, d_a, d_b, d_c, m, n, k);
  }
  return cudaErrorInvalidValue;
}

cudaError_t GemmBf16OnHandle(void* handle, const void* d_a, const void* d_b, float* d_c, int64_t m,
                             int64_t n, int64_t k) {
  const float one = 1.0f, zero = 0.0f;
  return FromBlas(cublasGemmEx_64(static_cast<cublasHandle_t>(handle), CUBLAS_OP_N, CUBLAS_OP_N, n,
                                  m, k, &one, d_b, CUDA_R_16BF, n, d_a, CUDA_R_16BF, k, &zero, d_c,
                                  CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void* CreateBlasHandle(cudaStream_t stream, size_t workspace_bytes, void** d_workspace) {
  *d_workspace = nullptr;
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return nullptr;
  bool ok = cublasSetStream(h, stream) == CUBLAS_STATUS_SUCCESS;
  if (ok && workspace_bytes > 0) {
    ok = cudaMalloc(d_workspace, workspace_bytes) == cudaSuccess &&
         cublasSetWorkspace(h, *d_workspace, workspace_bytes) == CUBLAS_STATUS_SUCCESS;
  }
  if (!ok) {
    DestroyBlasHandle(h, *d_workspace);
    *d_workspace = nullptr;
    return nullptr;
  }
  return h;
}

void DestroyBlasHandle(void* handle, void* d_workspace) {
  if (handle != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle));
  if (d_workspace != nullptr) cudaFree(d_workspace);
}

}  // namespace opserve::bench
