// matmul, step 1 of siboehm's SGEMM_CUDA: one thread per output element, no reuse at all.
//
// Consecutive threadIdx.x are consecutive ROWS of C, so a warp reads 32 different rows of A
// (32 separate sectors per load) and writes C with a stride of N: the uncoalesced baseline that
// the next step fixes. Each A and B element is re-read from L2/DRAM by every thread that needs it.
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kTile = 32;  // a block covers a kTile x kTile patch of C, one thread per element
static_assert(kTile * kTile <= 1024, "one thread per element of the block's patch");

template <typename T>
__global__ void __launch_bounds__(kTile * kTile)
    matmul_naive_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                        float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                        int64_t tiles_m) {
  const TileCoord tile = matmul::PlainTile(tiles_m);
  const int64_t row = tile.m * kTile + threadIdx.x;  // threadIdx.x walks rows: uncoalesced
  const int64_t col = tile.n * kTile + threadIdx.y;
  if (row >= m || col >= n) return;
  const T* a_row = d_a + row * k;
  float acc = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    acc += matmul::ToFloat(a_row[i]) * matmul::ToFloat(d_b[i * n + col]);
  }
  d_c[row * n + col] = acc;
}

}  // namespace

OPSERVE_DEFINE_MATMUL_TILES(MatmulNaive, matmul_naive_kernel,
                            /*tile_m=*/kTile, /*tile_n=*/kTile, /*block=*/dim3(kTile, kTile))

}  // namespace opserve::kernels
