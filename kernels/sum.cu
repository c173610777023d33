// sum: the reduction family's whole-tensor algorithms (reduce.h) instantiated for the Sum
// operator. one_pass_atomic is the add-only one.
#include "kernels/reduce_chunked.cuh"
#include "kernels/reduce_cub.cuh"
#include "kernels/reduce_one_pass_atomic.cuh"
#include "kernels/reduce_two_pass.cuh"
#include "kernels/reduce_vectorized.cuh"
#include "kernels/reduce_warp_shuffle.cuh"

namespace opserve::kernels {

OPSERVE_INSTANTIATE_REDUCE_F32_I32(ReduceTwoPass, Sum)
OPSERVE_INSTANTIATE_REDUCE_F32_I32(ReduceWarpShuffle, Sum)
OPSERVE_INSTANTIATE_REDUCE_F32_I32(ReduceOnePassAtomic, Sum)
OPSERVE_INSTANTIATE_REDUCE_ALL(ReduceVectorized, Sum)
OPSERVE_INSTANTIATE_REDUCE_ALL(ReduceChunked, Sum)
OPSERVE_INSTANTIATE_REDUCE_ALL(ReduceCub, Sum)

}  // namespace opserve::kernels
