// row_max: the reduction family's row algorithms (reduce.h) instantiated for the Max operator.
// No naive: the sums' slow baseline is not repeated (server/ops/reduce_family.h).
#include "kernels/row_reduce_block_per_row.cuh"
#include "kernels/row_reduce_cub_segmented.cuh"
#include "kernels/row_reduce_warp_per_row.cuh"

namespace opserve::kernels {

OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(RowReduceBlockPerRow, Max)
OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(RowReduceWarpPerRow, Max)
OPSERVE_INSTANTIATE_ROW_REDUCE_ALL(RowReduceCubSegmented, Max)

}  // namespace opserve::kernels
