// The operators of the reduction family (kernels/reduce.h), as tags, in the manner of CUB's
// cub::Sum / cub::Max functors: plain C++ without a CUDA header, so the op table names them in
// every build, the CPU-only one too. Their device side (accumulator, identity, combine, finish)
// is kernels/reduce_op.cuh.
#pragma once

namespace opserve::kernels {

struct Sum {};
struct Mean {};  // rows only: Sum's combine, then divided by the row length
struct Max {};
struct Min {};

}  // namespace opserve::kernels
