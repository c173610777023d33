// matmul, step 5 of siboehm's SGEMM_CUDA: 2-D blocktiling.
//
// A block of kThreads computes a kBM x kBN patch of C; each thread computes a kTM x kTN sub-tile.
// Per step of the dot product a thread loads kTM values of A and kTN values of B from shared
// memory into registers and does kTM * kTN FMAs with them: the register outer product raises
// arithmetic intensity over shared memory from ~1 FMA per load (step 3) to kTM*kTN/(kTM+kTN).
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kBM = 128;  // rows of C per block
constexpr int kBN = 128;  // columns of C per block
constexpr int kBK = 8;    // depth of one shared-memory chunk
constexpr int kTM = 8;    // rows of C per thread
constexpr int kTN = 8;    // columns of C per thread
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);
static_assert(kBM % kTM == 0 && kBN % kTN == 0, "thread tiles must tile the block tile");
// Loads: each pass of the block covers kThreads / kBK rows of the A chunk and kThreads / kBN
// rows of the B chunk; the passes must tile the chunks exactly.
static_assert(kThreads % kBK == 0 && kBM % (kThreads / kBK) == 0, "A chunk load passes");
static_assert(kThreads % kBN == 0 && kBK % (kThreads / kBN) == 0, "B chunk load passes");
constexpr int kARowsPerPass = kThreads / kBK;
constexpr int kBRowsPerPass = kThreads / kBN;

// Two blocks a multiprocessor: caps the registers at 128 a thread (64 accumulators + operands).
constexpr int kMinBlocksPerSm = 2;

template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    matmul_block_tiled_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                              float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                              int64_t tiles_m) {
  __shared__ float a_s[kBM * kBK];  // [kBM][kBK]
  __shared__ float b_s[kBK * kBN];  // [kBK][kBN]

  const TileCoord tile = matmul::PlainTile(tiles_m);
  const int64_t m0 = tile.m * kBM;
  const int64_t n0 = tile.n * kBN;

  const int thread_col = threadIdx.x % (kBN / kTN);
  const int thread_row = threadIdx.x / (kBN / kTN);

  // Load placement; rows of later passes are kARowsPerPass / kBRowsPerPass further down.
  const int a_r = threadIdx.x / kBK;
  const int a_c = threadIdx.x % kBK;
  const int b_r = threadIdx.x / kBN;
  const int b_c = threadIdx.x % kBN;
  // Rows of A this thread may load: a_r, a_r + kARowsPerPass, ... while below a_rows_left.
  const int64_t a_rows_left = m - m0 - a_r;
  const T* a_ptr = d_a + (m0 + (a_rows_left > 0 ? a_r : 0)) * k + a_c;  // in bounds
  const int64_t a_pass_stride = kARowsPerPass * k;
  const int64_t b_col = n0 + b_c;
  const bool b_col_ok = b_col < n;
  const T* b_ptr = d_b + static_cast<int64_t>(b_r) * n + (b_col_ok ? b_col : n - 1);

  float acc[kTM * kTN] = {};
  float reg_m[kTM];
  float reg_n[kTN];

  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    const bool a_col_ok = k0 + a_c < k;
#pragma unroll
    for (int p = 0; p < kBM / kARowsPerPass; ++p) {
      a_s[(a_r + p * kARowsPerPass) * kBK + a_c] =
          (p * kARowsPerPass < a_rows_left && a_col_ok)
              ? matmul::ToFloat(a_ptr[p * a_pass_stride + k0])
              : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < kBK / kBRowsPerPass; ++p) {
      const int64_t kk = k0 + b_r + p * kBRowsPerPass;
      b_s[(b_r + p * kBRowsPerPass) * kBN + b_c] =
          (b_col_ok && kk < k) ? matmul::ToFloat(b_ptr[(k0 + p * kBRowsPerPass) * n]) : 0.0f;
    }
    __syncthreads();

#pragma unroll
    for (int dot = 0; dot < kBK; ++dot) {
#pragma unroll
      for (int i = 0; i < kTM; ++i) reg_m[i] = a_s[(thread_row * kTM + i) * kBK + dot];
#pragma unroll
      for (int j = 0; j < kTN; ++j) reg_n[j] = b_s[dot * kBN + thread_col * kTN + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i * kTN + j] += reg_m[i] * reg_n[j];
      }
    }
    // Sync again so that faster threads do not overwrite the chunk others are still reading.
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t row = m0 + thread_row * kTM + i;
    if (row >= m) break;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t col = n0 + thread_col * kTN + j;
      if (col < n) d_c[row * n + col] = acc[i * kTN + j];
    }
  }
}

}  // namespace

OPSERVE_DEFINE_MATMUL_TILES(MatmulBlockTiled, matmul_block_tiled_kernel,
                            /*tile_m=*/kBM, /*tile_n=*/kBN, /*block=*/kThreads)

}  // namespace opserve::kernels
