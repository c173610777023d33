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

}  // namespace opserve::kernels::transpose_detail
