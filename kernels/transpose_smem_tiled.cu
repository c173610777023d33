// transpose, shared-memory tiled (the classic): a 32x32 tile staged through shared memory by
// 32x8 threads, 4 elements each. Reads and writes are both row-contiguous per warp; the tile row is
// padded (by one 4-byte bank, or one 8-byte element) so that the column-wise reads of the tile
// spread over all 32 banks.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/transpose.h"
#include "kernels/transpose_common.cuh"

namespace opserve::kernels {
namespace {

constexpr int kTile = 32;       // tile edge: a warp spans one tile row
constexpr int kBlockRows = 8;   // 32x8 threads, each moving kTile / kBlockRows = 4 elements
static_assert(kTile == 32, "one warp per tile row: coalescing and the bank analysis assume it");
static_assert(kTile % kBlockRows == 0, "each thread moves a whole number of elements");

// Pad each tile row by one 4-byte bank (one fp32, two bf16): a row is then 33 words long, so the 32
// rows of one tile column land in 32 different banks. One bf16 of padding would leave 2-way
// conflicts (row length 16.5 words).
// 8-byte elements (int64) get one element, 2 banks, of padding (4 / 8 would be none): a warp's
// 8-byte accesses are served as two half-warps of 16 threads x 8 bytes, each conflict-free when
// its 16 addresses fall in 16 different bank pairs. Unpadded, a row is 64 words, so all of a
// column's rows start in the same bank pair (16-way conflicts); padded, it is 66 words, and row r
// of a column starts at bank pair (r + c) mod 16: 16 different pairs in each half-warp.
template <typename T>
inline constexpr int kPad = sizeof(T) >= 4 ? 1 : static_cast<int>(4 / sizeof(T));
static_assert(kPad<uint16_t> == 2 && kPad<uint32_t> == 1 && kPad<uint64_t> == 1,
              "padding of one 4-byte bank, at least one element");

template <typename T>
__global__ void __launch_bounds__(kTile * kBlockRows)
    transpose_smem_tiled_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows,
                                int64_t cols) {
  __shared__ T tile[kTile][kTile + kPad<T>];
  const int64_t tiles_x = CeilDiv<int64_t>(cols, kTile);
  const int64_t tiles_y = CeilDiv<int64_t>(rows, kTile);
  // Loops cover grids capped at the hardware limits (see TileGrid); usually one trip each. The trip
  // counts depend on blockIdx only, so every thread reaches the same barriers.
  for (int64_t ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
    for (int64_t tx = blockIdx.x; tx < tiles_x; tx += gridDim.x) {
      const int64_t r0 = ty * kTile;
      const int64_t c0 = tx * kTile;
      const int64_t c = c0 + threadIdx.x;
#pragma unroll
      for (int j = 0; j < kTile; j += kBlockRows) {
        const int64_t r = r0 + threadIdx.y + j;
        if (r < rows && c < cols) tile[threadIdx.y + j][threadIdx.x] = in[r * cols + c];
      }
      __syncthreads();
      // Output row = input column c0 + threadIdx.y + j; output column = input row r0 + threadIdx.x.
      const int64_t out_c = r0 + threadIdx.x;
#pragma unroll
      for (int j = 0; j < kTile; j += kBlockRows) {
        const int64_t out_r = c0 + threadIdx.y + j;
        if (out_r < cols && out_c < rows) out[out_r * rows + out_c] = tile[threadIdx.x][threadIdx.y + j];
      }
      // The next trip overwrites the tile: every thread must be done reading it.
      __syncthreads();
    }
  }
}

}  // namespace

OPSERVE_DEFINE_TRANSPOSE_TILES(TransposeSmemTiled, transpose_smem_tiled_kernel,
                               /*tile_rows=*/kTile, /*tile_cols=*/kTile,
                               /*block=*/dim3(kTile, kBlockRows))

}  // namespace opserve::kernels
