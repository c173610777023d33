// max: the reduction family's whole-tensor algorithms (reduce.h) instantiated for the Max
// operator. No one_pass_atomic: its atomic is an add (server/ops/reduce_family.h says why).
#include "kernels/reduce_chunked.cuh"
#include "kernels/reduce_cub.cuh"
#include "kernels/reduce_two_pass.cuh"
#include "kernels/reduce_vectorized.cuh"
#include "kernels/reduce_warp_shuffle.cuh"

namespace opserve::kernels {

OPSERVE_INSTANTIATE_REDUCE_F32_I32(ReduceTwoPass, Max)
OPSERVE_INSTANTIATE_REDUCE_F32_I32(ReduceWarpShuffle, Max)
OPSERVE_INSTANTIATE_REDUCE_ALL(ReduceVectorized, Max)
OPSERVE_INSTANTIATE_REDUCE_ALL(ReduceChunked, Max)
OPSERVE_INSTANTIATE_REDUCE_ALL(ReduceCub, Max)

}  // namespace opserve::kernels
