// matmul through cuBLAS: the reference the hand-written kernels are measured against.
//
// cuBLAS is column-major. A row-major M x N matrix is the same memory as a column-major N x M
// one (its transpose), so row-major C = A * B is computed as column-major C^T = B^T * A^T:
// gemm(N, M, K, B with ld N, A with ld K, C with ld N), no transposes.
//   FLOAT32:  cublasSgemm in the handle's math mode. The server creates the handle with the
//             default mode, which keeps full FP32 (no TF32 tensor cores).
//   BFLOAT16: cublasGemmEx with bf16 inputs, float32 output and CUBLAS_COMPUTE_32F.
// The _64 entry points take int64 sizes, so no dimension is truncated.
#include "kernels/cublas_loader.h"
#include "kernels/matmul.h"

namespace opserve::kernels {
namespace {

cudaError_t ToCudaError(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

// Points the handle at `stream` only when it is not there already: cublasSetStream also resets
// the handle's workspace to the default pool, every time, and the server's handle is bound to its
// worker's stream once, at creation, so the reset would be useless work.
cudaError_t UseStream(cublasHandle_t handle, cudaStream_t stream) {
  cudaStream_t current = nullptr;
  if (Cublas()->get_stream(handle, &current) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  if (current == stream) return cudaSuccess;
  return ToCudaError(Cublas()->set_stream(handle, stream));
}

// What both overloads do around their gemm call: an empty C is done; otherwise the handle is
// checked and pointed at `stream`, and gemm(handle)'s cuBLAS status becomes a cudaError_t.
template <typename Gemm>
cudaError_t RunGemm(void* cublas_handle, int64_t m, int64_t n, cudaStream_t stream, Gemm gemm) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if (Cublas() == nullptr || cublas_handle == nullptr) return cudaErrorSharedObjectInitFailed;
  auto handle = static_cast<cublasHandle_t>(cublas_handle);
  if (const cudaError_t err = UseStream(handle, stream); err != cudaSuccess) return err;
  return ToCudaError(gemm(handle));
}

// C = 1 * A * B + 0 * C, scalars in host memory (the handle's default pointer mode).
constexpr float kAlpha = 1.0f;
constexpr float kBeta = 0.0f;

}  // namespace

// cuBLAS's (A, B) are our (B, A) in both.
cudaError_t MatmulCublas(void* cublas_handle, const float* d_a, const float* d_b, float* d_c,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  return RunGemm(cublas_handle, m, n, stream, [&](cublasHandle_t handle) {
    return Cublas()->sgemm_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, /*m=*/n, /*n=*/m, k, &kAlpha, d_b,
                              /*lda=*/n, d_a, /*ldb=*/k, &kBeta, d_c, /*ldc=*/n);
  });
}

cudaError_t MatmulCublas(void* cublas_handle, const bf16_bits* d_a, const bf16_bits* d_b,
                         float* d_c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  return RunGemm(cublas_handle, m, n, stream, [&](cublasHandle_t handle) {
    return Cublas()->gemm_ex_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, /*m=*/n, /*n=*/m, k, &kAlpha,
                                d_b, CUDA_R_16BF, /*lda=*/n, d_a, CUDA_R_16BF, /*ldb=*/k, &kBeta,
                                d_c, CUDA_R_32F, /*ldc=*/n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT);
  });
}

// Columns [n_begin, n_end) of row-major B and C are rows of column-major B^T and C^T: the same
// leading dimension N, the pointers n_begin elements in, and n_end - n_begin of them.
cudaError_t MatmulCublasColumns(void* cublas_handle, const float* d_a, const float* d_b,
                                float* d_c, int64_t m, int64_t n, int64_t k, int64_t n_begin,
                                int64_t n_end, cudaStream_t stream) {
  return RunGemm(cublas_handle, m, n_end - n_begin, stream, [&](cublasHandle_t handle) {
    return Cublas()->sgemm_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, /*m=*/n_end - n_begin, /*n=*/m, k,
                              &kAlpha, d_b + n_begin, /*lda=*/n, d_a, /*ldb=*/k, &kBeta,
                              d_c + n_begin, /*ldc=*/n);
  });
}

cudaError_t MatmulCublasColumns(void* cublas_handle, const bf16_bits* d_a, const bf16_bits* d_b,
                                float* d_c, int64_t m, int64_t n, int64_t k, int64_t n_begin,
                                int64_t n_end, cudaStream_t stream) {
  return RunGemm(cublas_handle, m, n_end - n_begin, stream, [&](cublasHandle_t handle) {
    return Cublas()->gemm_ex_64(handle, CUBLAS_OP_N, CUBLAS_OP_N, /*m=*/n_end - n_begin, /*n=*/m,
                                k, &kAlpha, d_b + n_begin, CUDA_R_16BF, /*lda=*/n, d_a,
                                CUDA_R_16BF, /*ldb=*/k, &kBeta, d_c + n_begin, CUDA_R_32F,
                                /*ldc=*/n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

// C^T, row-major [N, M], is column-major C [M, N] with ld M. Our row-major A [M, K] is
// column-major A^T (ld K) and B [K, N] column-major B^T (ld N), so both go in transposed:
// gemm(T, T, M, N, K, A with ld K, B with ld N, C^T with ld M).
cudaError_t MatmulCublasTransposed(void* cublas_handle, const float* d_a, const float* d_b,
                                   float* d_c_t, int64_t m, int64_t n, int64_t k,
                                   cudaStream_t stream) {
  return RunGemm(cublas_handle, m, n, stream, [&](cublasHandle_t handle) {
    return Cublas()->sgemm_64(handle, CUBLAS_OP_T, CUBLAS_OP_T, m, n, k, &kAlpha, d_a,
                              /*lda=*/k, d_b, /*ldb=*/n, &kBeta, d_c_t, /*ldc=*/m);
  });
}

cudaError_t MatmulCublasTransposed(void* cublas_handle, const bf16_bits* d_a,
                                   const bf16_bits* d_b, float* d_c_t, int64_t m, int64_t n,
                                   int64_t k, cudaStream_t stream) {
  return RunGemm(cublas_handle, m, n, stream, [&](cublasHandle_t handle) {
    return Cublas()->gemm_ex_64(handle, CUBLAS_OP_T, CUBLAS_OP_T, m, n, k, &kAlpha, d_a,
                                CUDA_R_16BF, /*lda=*/k, d_b, CUDA_R_16BF, /*ldb=*/n, &kBeta,
                                d_c_t, CUDA_R_32F, /*ldc=*/m, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT);
  });
}

}  // namespace opserve::kernels
