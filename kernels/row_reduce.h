// row_sum / row_mean: FLOAT32 [rows, cols] -> FLOAT32 [rows]. `mean` divides each sum by cols.
// All launchers use the CUB two-phase temp convention (common.h).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

#define OPSERVE_DECLARE_ROW_REDUCE(Name)                                                      \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const float* d_in, float* d_out,        \
                   int64_t rows, int64_t cols, bool mean, cudaStream_t stream);

// One thread per row.
OPSERVE_DECLARE_ROW_REDUCE(RowReduceNaive)
// One block per row, unrolled independent loads; the block size is chosen from rows vs the SM
// count and from cols, as llama.cpp's reduce_rows_f32 does.
OPSERVE_DECLARE_ROW_REDUCE(RowReduceBlockPerRow)
// One warp per row: for short rows.
OPSERVE_DECLARE_ROW_REDUCE(RowReduceWarpPerRow)
// cub::DeviceSegmentedReduce::Sum, then a scale for the mean.
OPSERVE_DECLARE_ROW_REDUCE(RowReduceCubSegmented)

#undef OPSERVE_DECLARE_ROW_REDUCE

}  // namespace opserve::kernels
