// matmul, step 3 of siboehm's SGEMM_CUDA: shared-memory cache blocking.
//
// A block computes a kTile x kTile patch of C. It walks K in chunks of kTile: every thread loads
// one element of the A chunk and one of the B chunk into shared memory (coalesced), then all
// threads run the kTile-long dot product out of shared memory. Each global element is read once
// per block instead of once per thread, cutting global traffic by kTile.
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kTile = 32;
constexpr int kThreads = kTile * kTile;
static_assert(kThreads <= 1024, "one thread per element of the block's patch");
static_assert(kTile == 32, "a warp must span one row of the patch (coalesced loads, no bank "
                           "conflicts on B, broadcast on A)");

template <typename T>
__global__ void __launch_bounds__(kThreads)
    matmul_tiled_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                        float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                        int64_t tiles_m) {
  __shared__ float a_s[kTile][kTile];
  __shared__ float b_s[kTile][kTile];

  const TileCoord tile = matmul::PlainTile(tiles_m);
  const int ty = threadIdx.x / kTile;
  const int tx = threadIdx.x % kTile;
  const int64_t row = tile.m * kTile + ty;
  const int64_t col = tile.n * kTile + tx;
  // Clamp the row / column used for addressing so that no pointer leaves the matrices; the
  // guards below decide whether the element is used.
  const T* a_row = d_a + (row < m ? row : m - 1) * k;
  const T* b_col = d_b + (col < n ? col : n - 1);

  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    // Out-of-range elements are zero, so the dot product below needs no guard.
    a_s[ty][tx] = (row < m && k0 + tx < k) ? matmul::ToFloat(a_row[k0 + tx]) : 0.0f;
    b_s[ty][tx] = (col < n && k0 + ty < k) ? matmul::ToFloat(b_col[(k0 + ty) * n]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += a_s[ty][i] * b_s[i][tx];
    // Sync again so that no thread overwrites the tiles for the next chunk while slower threads
    // are still reading this one.
    __syncthreads();
  }
  if (row < m && col < n) d_c[row * n + col] = acc;
}

}  // namespace

OPSERVE_DEFINE_MATMUL_TILES(MatmulTiled, matmul_tiled_kernel,
                            /*tile_m=*/kTile, /*tile_n=*/kTile, /*block=*/kThreads)

}  // namespace opserve::kernels
