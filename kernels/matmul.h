// matmul: C[M,N] = A[M,K] x B[K,N], all row-major. FLOAT32 x FLOAT32 -> FLOAT32 and
// BFLOAT16 x BFLOAT16 -> FLOAT32 (accumulation in float32). No scratch memory.
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

#define OPSERVE_DECLARE_MATMUL(Name)                                                          \
  cudaError_t Name(const float* d_a, const float* d_b, float* d_c, int64_t m, int64_t n,     \
                   int64_t k, cudaStream_t stream);                                           \
  cudaError_t Name(const bf16_bits* d_a, const bf16_bits* d_b, float* d_c, int64_t m,        \
                   int64_t n, int64_t k, cudaStream_t stream);

// The steps of siboehm's SGEMM_CUDA, one file each.
OPSERVE_DECLARE_MATMUL(MatmulNaive)                 // a thread per output, uncoalesced
OPSERVE_DECLARE_MATMUL(MatmulCoalescing)            // a warp reads contiguous B columns
OPSERVE_DECLARE_MATMUL(MatmulTiled)                 // shared-memory tiles of A and B
OPSERVE_DECLARE_MATMUL(MatmulTiledRegister)         // 1-D register tiling: TM outputs a thread
OPSERVE_DECLARE_MATMUL(MatmulBlockTiled)            // 2-D register tiling: TMxTN a thread
OPSERVE_DECLARE_MATMUL(MatmulBlockTiledVectorized)  // + 16-byte loads, A transposed in smem
OPSERVE_DECLARE_MATMUL(MatmulWarpTiled)             // + warp tiles of 64 x 64, 8 x 16 a thread
// Tensor cores: TF32 mma for FLOAT32 inputs, BF16 mma for BFLOAT16 inputs, float32 accumulate.
OPSERVE_DECLARE_MATMUL(MatmulTensorCore)
// Shared memory a block of MatmulTensorCore asks for (its largest dtype's ring): more than
// 8.6, 8.9 and 12.0 devices give a block.
int MatmulTensorCoreSharedBytes();
// Hopper (sm_90a): wgmma fed by TMA, the same precisions. Runs only the shapes
// MatmulTensorCoreSm90aSupports accepts, with 16-byte aligned A and B, on a device of compute
// capability 9.0; cudaErrorNotSupported / cudaErrorInvalidValue otherwise. It never runs another
// kernel in its place: the server sends other shapes to another row, and reports that row.
OPSERVE_DECLARE_MATMUL(MatmulTensorCoreSm90a)

#undef OPSERVE_DECLARE_MATMUL

// Shapes the sm_90a kernel takes: rows of A and B 16-byte multiples (TMA), K >= 256 and at
// least 128 output tiles (below that the 128 x 128 mma.sync kernel fills the GPU better), and
// dimensions whose coordinates fit TMA's int32 operands. Plain host code: no device query.
bool MatmulTensorCoreSm90aSupports(int64_t m, int64_t n, int64_t k, int elem_bytes);

// cuBLAS needs a handle, created once per device worker. The handle is passed as void* so that
// this header does not pull in cublas_v2.h. FLOAT32 runs cublasSgemm in full FP32 precision;
// BFLOAT16 runs cublasGemmEx with CUBLAS_COMPUTE_32F. Returns cudaErrorUnknown on a cuBLAS error.
cudaError_t MatmulCublas(void* cublas_handle, const float* d_a, const float* d_b, float* d_c,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream);
cudaError_t MatmulCublas(void* cublas_handle, const bf16_bits* d_a, const bf16_bits* d_b,
                         float* d_c, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
// Columns [n_begin, n_end) of C = A B: A times those columns of B (A is M x K and B K x N as
// above, C's other columns untouched). A sharded matmul's GEMM runs block by block as B's
// columns arrive from another GPU.
cudaError_t MatmulCublasColumns(void* cublas_handle, const float* d_a, const float* d_b,
                                float* d_c, int64_t m, int64_t n, int64_t k, int64_t n_begin,
                                int64_t n_end, cudaStream_t stream);
cudaError_t MatmulCublasColumns(void* cublas_handle, const bf16_bits* d_a, const bf16_bits* d_b,
                                float* d_c, int64_t m, int64_t n, int64_t k, int64_t n_begin,
                                int64_t n_end, cudaStream_t stream);
// The same products written transposed: d_c_t is C^T, row-major [N, M] (the planner's fused
// transpose(matmul(A, B))).
cudaError_t MatmulCublasTransposed(void* cublas_handle, const float* d_a, const float* d_b,
                                   float* d_c_t, int64_t m, int64_t n, int64_t k,
                                   cudaStream_t stream);
cudaError_t MatmulCublasTransposed(void* cublas_handle, const bf16_bits* d_a,
                                   const bf16_bits* d_b, float* d_c_t, int64_t m, int64_t n,
                                   int64_t k, cudaStream_t stream);

}  // namespace opserve::kernels
