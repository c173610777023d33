// matmul, step 2 of siboehm's SGEMM_CUDA: global memory coalescing.
//
// Same one-thread-per-output work as the naive kernel, but the 32 threads of a warp now cover 32
// consecutive COLUMNS of one row of C: their B loads fall in one 128-byte line, their A load is a
// broadcast of one element, and their C stores are one coalesced line.
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kTile = 32;  // a block covers a kTile x kTile patch of C
constexpr int kThreads = kTile * kTile;
static_assert(kThreads <= 1024, "one thread per element of the block's patch");
static_assert(kTile == 32, "a warp must span exactly one row of the patch");

template <typename T>
__global__ void __launch_bounds__(kThreads)
    matmul_coalescing_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                             float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                             int64_t tiles_m) {
  const TileCoord tile = matmul::PlainTile(tiles_m);
  const int64_t row = tile.m * kTile + threadIdx.x / kTile;
  const int64_t col = tile.n * kTile + threadIdx.x % kTile;  // lanes walk columns: coalesced
  if (row >= m || col >= n) return;
  const T* a_row = d_a + row * k;
  const T* b_col = d_b + col;
  float acc = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    acc += matmul::ToFloat(a_row[i]) * matmul::ToFloat(b_col[i * n]);
  }
  d_c[row * n + col] = acc;
}

}  // namespace

OPSERVE_DEFINE_MATMUL_TILES(MatmulCoalescing, matmul_coalescing_kernel,
                            /*tile_m=*/kTile, /*tile_n=*/kTile, /*block=*/kThreads)

}  // namespace opserve::kernels
