// row_mean: the reduction family's row algorithms (reduce.h) instantiated for the Mean operator.
#include "kernels/row_reduce_block_per_row.cuh"
#include "kernels/row_reduce_cub_segmented.cuh"
#include "kernels/row_reduce_naive.cuh"
#include "kernels/row_reduce_warp_per_row.cuh"

namespace opserve::kernels {

OPSERVE_INSTANTIATE_ROW_REDUCE(RowReduceNaive, Mean, float)
OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(RowReduceBlockPerRow, Mean)
OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(RowReduceWarpPerRow, Mean)
OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(RowReduceCubSegmented, Mean)

}  // namespace opserve::kernels
