// The knobs of TransposeTma (kernels/transpose_tma.cu), for the kernel layer and its benchmark
// only: TransposeTma itself runs TransposeTmaDefaultTuning(elem_bytes). opserve-bench --transpose-sweep times
// every supported combination, which is how the defaults were chosen (docs/performance/history.md).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

struct TransposeTmaTuning {
  // FLOAT32/INT32 tile: tile_rows x (boxes * 32) elements, each box 128 bytes wide. Supported
  // by the persistent form: (64, 2), (64, 4), (128, 2), (128, 4); one tile per CTA: see below.
  // BFLOAT16 has one build, 64 x (2 * 64), persistent: a tuning for it must name (64, 2) and
  // one_tile_per_cta = false (cudaErrorInvalidValue otherwise); the group, the promotion and
  // max_ctas_per_sm apply.
  int tile_rows = 64;
  int boxes = 2;
  // Tiles are handed out walking down groups of this many tile rows; 0 (or less), or more than
  // the matrix has: the whole tile column (column-major order).
  int group_tile_rows = 32;
  // L2 promotion of the input's TMA loads: 256 bytes instead of 128.
  bool l2_promote_256 = false;
  // Resident CTAs per SM (capped by what fits). With one_tile_per_cta, >= 4 selects the builds
  // whose registers are capped for 4 CTAs per SM, (64, 2) and (32, 4), where they exist.
  int max_ctas_per_sm = 2;
  // FLOAT32/INT32 only: a CTA per tile with a single stage, the grid as large as the tile count
  // (blocks dispatched in tile order, as sum/chunked reads), instead of a persistent grid that
  // pipelines tiles through several stages. Supported tiles: (32, 2), (32, 4), (64, 2), (64, 4),
  // (128, 2), (128, 4), (256, 2).
  bool one_tile_per_cta = false;
};

// What TransposeTma runs for this element width (4: FLOAT32/INT32, 2: BFLOAT16).
TransposeTmaTuning TransposeTmaDefaultTuning(int elem_bytes);

// TransposeTma with explicit knobs; cudaErrorInvalidValue for an unsupported tile.
cudaError_t TransposeTmaTuned(const TransposeTmaTuning& tuning, const void* d_in, void* d_out,
                              int64_t rows, int64_t cols, int elem_bytes, cudaStream_t stream);

}  // namespace opserve::kernels
