// The shape-based choice of row_sum / row_mean algorithm used by `auto`. Plain C++: callable from
// the server and from tests without CUDA. Returns one of the algorithm names "naive",
// "block_per_row", "warp_per_row", "cub_segmented".
//
// Initial heuristic (before benchmarks; see kernels/NOTES_row_reduce.md):
//   - rows < 2 * sm_count ("few rows"): block_per_row. Its launcher gives each row a
//     512-thread block, and rows of >= 64K floats are split over several blocks with a fixed
//     second pass, so few long rows (1 x 1M, 16 x 16M) still fill every SM, and few short rows
//     (10 x 2048) cost one small launch.
//   - many rows shorter than 1024 floats: warp_per_row (a persistent grid, one warp or a
//     sub-warp group per row, several rows in flight per lane). llama.cpp switches to a single
//     warp per row at the same 1024; doing it without one block launch per row is what makes
//     1M x 64 run at memory speed.
//   - many rows of >= 1024 floats: block_per_row (128 threads a row, 8 16-byte loads in flight
//     per thread: a 4096-float row in one round trip).
//   naive and cub_segmented are never chosen: naive is the slow baseline, and cub_segmented
//   (one 256-thread block per segment) is matched or beaten by the above on every shape.
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

inline constexpr int64_t kAutoFewRowsPerSm = 2;           // llama.cpp's "nrows / nsm < 2"
inline constexpr int64_t kAutoWarpPerRowMaxCols = 1023;   // llama.cpp's "ncols < 1024"

inline const char* ChooseRowReduceAlgorithm(int64_t rows, int64_t cols, int sm_count) {
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  if (rows < kAutoFewRowsPerSm * sms) return "block_per_row";
  if (cols <= kAutoWarpPerRowMaxCols) return "warp_per_row";
  return "block_per_row";
}

}  // namespace opserve::kernels
