// transpose, swizzled: the classic 32x32 tile and 32x8 threads (4 elements each), but instead of
// padding, element (r, c) of the tile is stored at column c ^ r. A tile row (fixed r) still maps to
// 32 distinct columns, and a tile column (fixed c, r = 0..31) maps to 32 distinct columns of 32
// distinct rows, i.e. 32 distinct banks for fp32, 16 distinct words per row parity for bf16, and
// for int64 16 distinct bank pairs in each half-warp (see Swizzle): conflict-free both ways with
// no wasted shared memory.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/transpose.h"
#include "kernels/transpose_common.cuh"

namespace opserve::kernels {
namespace {

constexpr int kTile = 32;       // tile edge: a warp spans one tile row
constexpr int kBlockRows = 8;   // 32x8 threads, each moving kTile / kBlockRows = 4 elements
static_assert(kTile == 32, "the XOR swizzle permutes 5-bit column indices");
static_assert(kTile % kBlockRows == 0, "each thread moves a whole number of elements");

// Column at which tile element (r, c) is stored. XOR with all 5 bits of the row: for bf16 a row is
// 16 words, rows of one parity share banks and (c ^ r) >> 1 = (c >> 1) ^ (r >> 1) runs over all
// 16 words as r >> 1 does, so a 32-row column read still hits 32 different banks. For int64 a row
// is 64 words, so every row starts in bank 0 and element (r, c) sits in bank pair (c ^ r) mod 16;
// a warp's 8-byte accesses go as two half-warps of 16 threads, and within one (r or c running over
// 16 consecutive values from a multiple of 16) (c ^ r) mod 16 takes 16 different values.
__device__ __forceinline__ int Swizzle(int r, int c) { return c ^ (r & (kTile - 1)); }

template <typename T>
__global__ void __launch_bounds__(kTile * kBlockRows)
    transpose_swizzled_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows,
                              int64_t cols) {
  __shared__ T tile[kTile][kTile];
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
        const int tr = threadIdx.y + j;
        const int64_t r = r0 + tr;
        if (r < rows && c < cols) tile[tr][Swizzle(tr, threadIdx.x)] = in[r * cols + c];
      }
      __syncthreads();
      // Output row = input column c0 + tc; output column = input row r0 + threadIdx.x.
      const int64_t out_c = r0 + threadIdx.x;
#pragma unroll
      for (int j = 0; j < kTile; j += kBlockRows) {
        const int tc = threadIdx.y + j;
        const int64_t out_r = c0 + tc;
        if (out_r < cols && out_c < rows) {
          out[out_r * rows + out_c] = tile[threadIdx.x][Swizzle(threadIdx.x, tc)];
        }
      }
      // The next trip overwrites the tile: every thread must be done reading it.
      __syncthreads();
    }
  }
}

}  // namespace

OPSERVE_DEFINE_TRANSPOSE_TILES(TransposeSwizzled, transpose_swizzled_kernel,
                               /*tile_rows=*/kTile, /*tile_cols=*/kTile,
                               /*block=*/dim3(kTile, kBlockRows))

}  // namespace opserve::kernels
