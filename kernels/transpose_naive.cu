// transpose, naive: one thread per element. A warp reads 32 consecutive elements of one input row
// (coalesced) and writes them to 32 different output rows (each store its own 32-byte sector), so
// the write side moves 4x (int64) / 8x (fp32) / 16x (bf16) the useful bytes through L2. The
// baseline.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/transpose.h"
#include "kernels/transpose_common.cuh"

namespace opserve::kernels {
namespace {

// A warp spans 32 columns of one row (coalesced reads); 8 rows per block give 256 threads.
constexpr int kBlockX = 32;
constexpr int kBlockY = 8;
static_assert(kBlockX == 32, "a warp must span one row segment for coalesced reads");

template <typename T>
__global__ void __launch_bounds__(kBlockX * kBlockY)
    transpose_naive_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows,
                           int64_t cols) {
  const int64_t tiles_x = CeilDiv<int64_t>(cols, kBlockX);
  const int64_t tiles_y = CeilDiv<int64_t>(rows, kBlockY);
  // Loops cover grids capped at the hardware limits (see TileGrid); usually one trip each.
  for (int64_t ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
    const int64_t r = ty * kBlockY + threadIdx.y;
    for (int64_t tx = blockIdx.x; tx < tiles_x; tx += gridDim.x) {
      const int64_t c = tx * kBlockX + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = in[r * cols + c];
    }
  }
}

}  // namespace

OPSERVE_DEFINE_TRANSPOSE_TILES(TransposeNaive, transpose_naive_kernel,
                               /*tile_rows=*/kBlockY, /*tile_cols=*/kBlockX,
                               /*block=*/dim3(kBlockX, kBlockY))

}  // namespace opserve::kernels
