// The shape-based choice of row_sum / row_mean algorithm used by `auto`. Plain C++: callable from
// the server and from tests without CUDA. Returns one of the algorithm names "naive",
// "block_per_row", "warp_per_row", "cub_segmented".
//
// Heuristic (first written before benchmarks; see kernels/NOTES_row_reduce.md):
//   - rows < 2 * sm_count ("few rows"): block_per_row. Its launcher gives each row a
//     512-thread block, and rows of >= 64K floats are split over several blocks with a fixed
//     second pass, so few long rows (1 x 1M, 16 x 16M) still fill every SM, and few short rows
//     (10 x 2048) cost one small launch.
//   - many rows shorter than 1024 floats: warp_per_row (a persistent grid, one warp or a
//     sub-warp group per row, several rows in flight per lane). llama.cpp switches to a single
//     warp per row at the same 1024; doing it without one block launch per row is what makes
//     1M x 64 run at memory speed.
//   - many rows of >= 1024 floats: block_per_row (128 threads a row, 8 16-byte loads in flight
//     per thread: a 4096-float row in one round trip; 512 threads from 8192 floats, see the
//     second revision below).
//   naive is never chosen: it is the slow baseline.
//
// Revised after opserve-bench (H200, 2026-11-22): many rows of 2048..8192 floats -> cub_segmented.
// There CUB's one-256-thread-block-per-row kernel already reads at the plain stream's rate over the
// same bytes (4096^2: CUB 19.4-19.5 us, the stream 19.1 us, block_per_row 19.7 us; 8192^2: 62.8 /
// 62.4 / 62.8; 65536 x 4096: 234.1 / 235.0 / 234.2), so no kernel of ours can beat it by more than
// noise, and at 4096^2 block_per_row was 1.6% behind. Taking CUB itself makes auto equal to the
// anchor by construction (ratio 1.000 within the 0.1-0.5% run-to-run noise of the method) instead
// of 0.984. CUB's segmented reduce is deterministic; its temp storage comes from the caller's
// scratch like block_per_row's. Rows of 1024..2047 floats (not measured) stay on block_per_row.
//
// Revised again (H100, 2026-11-23): many rows of >= 8192 floats -> block_per_row, whose launcher
// now gives such rows 512-thread blocks: a 32 KiB row is one round of 4 loads a thread. 8192^2 in
// a read-pattern diagnostic: 88.2 us against CUB's 89.2-89.5; in opserve-bench 87.8-88.2 against
// 88.7-88.9 (PERFORMANCE.md).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

inline constexpr int64_t kAutoFewRowsPerSm = 2;           // llama.cpp's "nrows / nsm < 2"
inline constexpr int64_t kAutoWarpPerRowMaxCols = 1023;   // llama.cpp's "ncols < 1024"

inline constexpr int64_t kAutoCubMinCols = 2048;           // measured: 4096 (see above)
inline constexpr int64_t kAutoCubMaxCols = 8191;

inline const char* ChooseRowReduceAlgorithm(int64_t rows, int64_t cols, int sm_count) {
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  if (rows < kAutoFewRowsPerSm * sms) return "block_per_row";
  if (cols <= kAutoWarpPerRowMaxCols) return "warp_per_row";
  if (cols >= kAutoCubMinCols && cols <= kAutoCubMaxCols) return "cub_segmented";
  return "block_per_row";
}

}  // namespace opserve::kernels
