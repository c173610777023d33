// Private helpers shared by the transpose algorithms (kernels/transpose_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common.h"

namespace opserve::kernels::transpose_detail {

// Hardware limits on the grid: gridDim.x up to 2^31 - 1, gridDim.y up to 65535. Tiled kernels
// put column tiles on x and row tiles on y and loop over whatever does not fit, so any
// rows, cols >= 1 (rows * cols past 2^31 included) is covered.
inline constexpr int64_t kMaxGridX = 2147483647;
inline constexpr int64_t kMaxGridY = 65535;

inline dim3 TileGrid(int64_t tiles_x, int64_t tiles_y) {
  return dim3(static_cast<unsigned>(std::min(tiles_x, kMaxGridX)),
              static_cast<unsigned>(std::min(tiles_y, kMaxGridY)), 1);
}

// Launchers only guard against what would corrupt memory (shapes and dtypes are validated by the
// server before launch): null pointers, non-positive sizes, an element size we have no kernel for.
// Every launcher moves 2- and 4-byte elements; those with an 8-byte (INT64) kernel pass
// allow_8_bytes. The default keeps the rest, transpose_tma among them, refusing 8.
inline bool ArgsOk(const void* d_in, const void* d_out, int64_t rows, int64_t cols, int elem_bytes,
                   bool allow_8_bytes = false) {
  return d_in != nullptr && d_out != nullptr && rows >= 1 && cols >= 1 &&
         (elem_bytes == 2 || elem_bytes == 4 || (allow_8_bytes && elem_bytes == 8));
}

// The element-agnostic launchers' entry: checks the arguments (2-, 4- or 8-byte elements), then
// calls launch(T{}) with T the unsigned integer of that size, which moves the element's bits.
template <typename F>
cudaError_t CheckAndLaunchBySize(const void* d_in, const void* d_out, int64_t rows, int64_t cols,
                                 int elem_bytes, F launch) {
  if (!ArgsOk(d_in, d_out, rows, cols, elem_bytes, /*allow_8_bytes=*/true)) {
    return cudaErrorInvalidValue;
  }
  switch (elem_bytes) {
    case 8: return launch(uint64_t{});
    case 4: return launch(uint32_t{});
    default: return launch(uint16_t{});
  }
}

// The launch of the tiled kernels (naive, smem_tiled, swizzled): checks the arguments, then runs
// kernel_for(T{}) -- the file's kernel for T, the unsigned integer of the element's size, taking
// (in, out, rows, cols) -- over a TileGrid of tile_rows x tile_cols tiles with `block` threads.
// Their files define their public function with OPSERVE_DEFINE_TRANSPOSE_TILES (below).
template <typename KernelFor>
cudaError_t CheckAndLaunchTiles(KernelFor kernel_for, int64_t tile_rows, int64_t tile_cols,
                                dim3 block, const void* d_in, void* d_out, int64_t rows,
                                int64_t cols, int elem_bytes, cudaStream_t stream) {
  return CheckAndLaunchBySize(d_in, d_out, rows, cols, elem_bytes, [&](auto element) {
    using T = decltype(element);
    const auto kernel = kernel_for(element);
    const dim3 grid =
        TileGrid(CeilDiv<int64_t>(cols, tile_cols), CeilDiv<int64_t>(rows, tile_rows));
    kernel<<<grid, block, 0, stream>>>(static_cast<const T*>(d_in), static_cast<T*>(d_out), rows,
                                       cols);
    return cudaPeekAtLastError();
  });
}

}  // namespace opserve::kernels::transpose_detail

// Defines kernels/transpose.h's `Name` (see OPSERVE_DECLARE_TRANSPOSE) as CheckAndLaunchTiles of
// `kernel`, the file's kernel template over the element's unsigned integer type. Use inside
// namespace opserve::kernels.
#define OPSERVE_DEFINE_TRANSPOSE_TILES(Name, kernel, tile_rows, tile_cols, block)               \
  cudaError_t Name(const void* d_in, void* d_out, int64_t rows, int64_t cols, int elem_bytes, \
                   cudaStream_t stream) {                                                     \
    return transpose_detail::CheckAndLaunchTiles(                                             \
        [](auto element) { return kernel<decltype(element)>; }, tile_rows, tile_cols, block,  \
        d_in, d_out, rows, cols, elem_bytes, stream);                                         \
  }
