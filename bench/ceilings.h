// The ceilings opserve-bench measures in the same run as the kernels (ceilings.cu): the
// device-to-device copy, a float4 read-only stream, cub::DeviceReduce::Sum,
// cub::DeviceSegmentedReduce::Sum, and cuBLAS SGEMM (pedantic FP32), TF32 and BF16.
// Plain C++ header: device pointers, sizes, an explicit stream last, cudaError_t back. BF16 data
// crosses it as raw uint16_t bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace opserve::bench {

// cudaMemcpyAsync device to device; the bandwidth counts bytes read plus bytes written.
cudaError_t CopyD2D(void* d_dst, const void* d_src, size_t bytes, cudaStream_t stream);

// Reads n floats (n a multiple of 4, 16-byte aligned) as float4 through the read-only path and
// writes nothing unless the sum hits an impossible value (so the loads cannot be dropped).
cudaError_t ReadStream(const float* d_in, int64_t n, float* d_sink, cudaStream_t stream);

// cub::DeviceReduce::Sum, two-phase temp as CUB's own (d_temp == nullptr: size query).
// Each input accumulates in its output's type: int32 into int64 (exact), int64 in int64
// (wrapping), bf16 in float32.
cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                         int64_t n, cudaStream_t stream);
cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                         int64_t n, cudaStream_t stream);
cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const int64_t* d_in, int64_t* d_out,
                         int64_t n, cudaStream_t stream);
cudaError_t CubReduceSum(void* d_temp, size_t* temp_bytes, const uint16_t* d_bf16, float* d_out,
                         int64_t n, cudaStream_t stream);

// cub::DeviceSegmentedReduce over the rows of a row-major [rows, cols] matrix: float rows with
// Sum; bf16 rows in a float32 accumulator and int32 rows in an int64 one (Reduce with an add and
// initial value of that type, the input a raw pointer so that CUB's loads stay vectorized).
cudaError_t CubSegmentedSum(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,
                            int64_t rows, int64_t cols, cudaStream_t stream);
cudaError_t CubSegmentedSum(void* d_temp, size_t* temp_bytes, const uint16_t* d_bf16, float* d_out,
                            int64_t rows, int64_t cols, cudaStream_t stream);
cudaError_t CubSegmentedSum(void* d_temp, size_t* temp_bytes, const int32_t* d_in, int64_t* d_out,
                            int64_t rows, int64_t cols, cudaStream_t stream);

// cuBLAS for row-major C[M,N] = A[M,K] x B[K,N] with float32 C.
class Blas {
 public:
  enum class Precision { kFp32Pedantic, kTf32, kBf16 };
  Blas() = default;
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cudaError_t Init(cudaStream_t stream);  // cudaErrorUnknown when cuBLAS fails
  // kFp32Pedantic and kTf32 take float A and B; kBf16 takes bf16 bits.
  cudaError_t Gemm(Precision precision, const void* d_a, const void* d_b, float* d_c, int64_t m,
                   int64_t n, int64_t k);

 private:
  void* pedantic_ = nullptr;  // cublasHandle_t in CUBLAS_PEDANTIC_MATH: SGEMM in full FP32
  void* fast_ = nullptr;      // cublasHandle_t in the default math mode: GemmEx TF32 / BF16
};

// For the cuBLAS handle diagnostic (--ops=cublas_handles): a new handle on `stream` in the
// default math mode, optionally with a workspace of its own (cublasSetWorkspace after
// cublasSetStream, which resets it); nullptr on failure. *d_workspace gets the cudaMalloc'ed
// workspace (nullptr for none) for DestroyBlasHandle to free.
void* CreateBlasHandle(cudaStream_t stream, size_t workspace_bytes, void** d_workspace);
void DestroyBlasHandle(void* handle, void* d_workspace);
// The benchmark's BF16 GemmEx (bf16 A, B; fp32 C; CUBLAS_COMPUTE_32F; row-major C = A B) on any
// handle, e.g. the server's own, through the linked cuBLAS.
cudaError_t GemmBf16OnHandle(void* handle, const void* d_a, const void* d_b, float* d_c, int64_t m,
                             int64_t n, int64_t k);

}  // namespace opserve::bench
