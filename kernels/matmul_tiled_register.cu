// matmul, step 4 of siboehm's SGEMM_CUDA: 1-D blocktiling.
//
// A block computes a kBM x kBN patch of C with kBM * kBN / kTM threads; each thread computes a
// column of kTM outputs. Per step of the dot product a thread reads one B value from shared
// memory into a register and reuses it for kTM multiply-adds (the A values are warp broadcasts),
// so shared-memory traffic per FMA drops by about kTM compared with step 3.
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kBM = 64;  // rows of C per block
constexpr int kBN = 64;  // columns of C per block
constexpr int kBK = 8;   // depth of one shared-memory chunk
constexpr int kTM = 8;   // outputs per thread, down one column
constexpr int kThreads = kBM * kBN / kTM;
static_assert(kBM % kTM == 0, "a thread's column of outputs must fit in the block's rows");
static_assert(kThreads == kBM * kBK, "each thread loads exactly one element of the A chunk");
static_assert(kThreads == kBK * kBN, "each thread loads exactly one element of the B chunk");
static_assert(kBN % 32 == 0, "a warp shares one thread row: A reads broadcast, B reads coalesce");

template <typename T>
__global__ void __launch_bounds__(kThreads)
    matmul_tiled_register_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                                 float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                                 int64_t tiles_m) {
  __shared__ float a_s[kBM * kBK];  // [kBM][kBK]
  __shared__ float b_s[kBK * kBN];  // [kBK][kBN]

  const TileCoord tile = matmul::PlainTile(tiles_m);
  const int64_t m0 = tile.m * kBM;
  const int64_t n0 = tile.n * kBN;

  // Output placement: a thread owns rows thread_row*kTM .. +kTM-1 of column thread_col.
  const int thread_col = threadIdx.x % kBN;
  const int thread_row = threadIdx.x / kBN;

  // Load placement: one A element (row a_r, col a_c) and one B element (row b_r, col b_c).
  const int a_r = threadIdx.x / kBK;
  const int a_c = threadIdx.x % kBK;
  const int b_r = threadIdx.x / kBN;
  const int b_c = threadIdx.x % kBN;
  const int64_t a_row = m0 + a_r;
  const int64_t b_col = n0 + b_c;
  const T* a_ptr = d_a + (a_row < m ? a_row : m - 1) * k + a_c;  // clamped: stays in bounds
  const T* b_ptr = d_b + static_cast<int64_t>(b_r) * n + (b_col < n ? b_col : n - 1);

  float acc[kTM] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    a_s[a_r * kBK + a_c] = (a_row < m && k0 + a_c < k) ? matmul::ToFloat(a_ptr[k0]) : 0.0f;
    b_s[b_r * kBN + b_c] = (b_col < n && k0 + b_r < k) ? matmul::ToFloat(b_ptr[k0 * n]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int dot = 0; dot < kBK; ++dot) {
      const float b_val = b_s[dot * kBN + thread_col];  // reused for kTM FMAs
#pragma unroll
      for (int i = 0; i < kTM; ++i) acc[i] += a_s[(thread_row * kTM + i) * kBK + dot] * b_val;
    }
    // Sync again so that faster threads do not overwrite the chunk others are still reading.
    __syncthreads();
  }

  const int64_t col = n0 + thread_col;
  if (col >= n) return;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t row = m0 + thread_row * kTM + i;
    if (row < m) d_c[row * n + col] = acc[i];
  }
}

}  // namespace

OPSERVE_DEFINE_MATMUL_TILES(MatmulTiledRegister, matmul_tiled_register_kernel,
                            /*tile_m=*/kBM, /*tile_n=*/kBN, /*block=*/kThreads)

}  // namespace opserve::kernels
