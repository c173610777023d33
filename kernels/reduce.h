// The reduction family: whole-tensor reductions (n elements -> one) and row reductions
// ([rows, cols] row-major -> [rows]), each launcher a template over an operator, as CUB's
// reductions take cub::Sum or cub::Max. One kernel per algorithm serves every operator; what an
// operator means on the device (accumulator, identity, combine, finish) is in reduce_op.cuh.
//
// Operators and the output type each gives (ReduceOutT):
//   Sum:  FLOAT32 -> FLOAT32, BFLOAT16 -> FLOAT32 (accumulated in float32), INT32 / INT64 ->
//         INT64 (exact; an INT64 overflow wraps modulo 2^64, as numpy's int64 sum does).
//   Mean: rows only, every input -> FLOAT32: the float sum times 1/cols, or an integer row's exact
//         int64 sum divided by cols in double and rounded once.
//   Max, Min: the input's type (a bf16 max is a bf16). NaN propagates: any NaN among the reduced
//         elements gives the canonical NaN (FLOAT32 0x7FFFFFFF, BFLOAT16 0x7FFF), whatever the
//         order; -0.0 orders below +0.0. Exact, so every algorithm gives the same bits.
// d_out of a whole-tensor launcher points at one element. All launchers use the CUB two-phase
// temp convention (common.h), even those that need no scratch.
//
// Each launcher is declared once per input type it runs, so that server/ops/cuda_launch.h tells a
// missing dtype by decltype on the overload set. The definitions live in the algorithm's .cuh
// (reduce_*.cuh, row_reduce_*.cuh); each op's .cu file (sum.cu, max.cu, row_mean.cu...)
// instantiates the algorithms it uses for its operator.
#pragma once

#include <cstdint>

#include "kernels/common.h"
#include "kernels/reduce_operators.h"

namespace opserve::kernels {

template <typename Op, typename In>
struct ReduceOut {
  using type = In;  // Max, Min, and Sum of FLOAT32 / INT64
};
template <>
struct ReduceOut<Sum, int32_t> {
  using type = int64_t;
};
template <>
struct ReduceOut<Sum, bf16_bits> {
  using type = float;
};
template <typename In>
struct ReduceOut<Mean, In> {
  using type = float;
};
template <typename Op, typename In>
using ReduceOutT = typename ReduceOut<Op, In>::type;

// The signatures of one input type's launcher; used for declaration, definition and explicit
// instantiation alike, so the three cannot drift apart.
#define OPSERVE_REDUCE_SIGNATURE(Name, Op, In)                                              \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const In* d_in, ReduceOutT<Op, In>* d_out, \
                   int64_t n, cudaStream_t stream)
#define OPSERVE_ROW_REDUCE_SIGNATURE(Name, Op, In)                                          \
  cudaError_t Name(void* d_temp, size_t* temp_bytes, const In* d_in, ReduceOutT<Op, In>* d_out, \
                   int64_t rows, int64_t cols, cudaStream_t stream)

#define OPSERVE_DECLARE_REDUCE(Name, In) \
  template <typename Op>                 \
  OPSERVE_REDUCE_SIGNATURE(Name, Op, In);
#define OPSERVE_DECLARE_ROW_REDUCE(Name, In) \
  template <typename Op>                     \
  OPSERVE_ROW_REDUCE_SIGNATURE(Name, Op, In);
#define OPSERVE_DECLARE_REDUCE_F32_I32(Name) \
  OPSERVE_DECLARE_REDUCE(Name, float)        \
  OPSERVE_DECLARE_REDUCE(Name, int32_t)
#define OPSERVE_DECLARE_REDUCE_ALL(Name) \
  OPSERVE_DECLARE_REDUCE_F32_I32(Name)   \
  OPSERVE_DECLARE_REDUCE(Name, int64_t)  \
  OPSERVE_DECLARE_REDUCE(Name, bf16_bits)
#define OPSERVE_DECLARE_ROW_REDUCE_ALL(Name) \
  OPSERVE_DECLARE_ROW_REDUCE(Name, float)    \
  OPSERVE_DECLARE_ROW_REDUCE(Name, int32_t)  \
  OPSERVE_DECLARE_ROW_REDUCE(Name, int64_t)  \
  OPSERVE_DECLARE_ROW_REDUCE(Name, bf16_bits)

// ---- Whole tensor: n elements -> one ----
// A shared-memory tree per block writes one partial per block; a second launch reduces them.
// FLOAT32 and INT32. Deterministic.
OPSERVE_DECLARE_REDUCE_F32_I32(ReduceTwoPass)
// As two_pass, but once 32 values remain per block the last warp finishes with __shfl_down_sync.
// FLOAT32 and INT32. Deterministic.
OPSERVE_DECLARE_REDUCE_F32_I32(ReduceWarpShuffle)
// One launch: each block reduces its slice and atomically adds it to d_out (zeroed with
// cudaMemsetAsync first). Sum only (an add atomic); float results depend on the order of the
// atomics: not deterministic. FLOAT32 and INT32.
OPSERVE_DECLARE_REDUCE_F32_I32(ReduceOnePassAtomic)
// Several 16-byte loads per thread in flight, a grid of one full wave, the last block to finish
// reduces the partials. Every input type. Deterministic.
OPSERVE_DECLARE_REDUCE_ALL(ReduceVectorized)
// One block per contiguous 16 KiB chunk; the last blocks to finish reduce the partials in index
// order. Every input type. Deterministic.
OPSERVE_DECLARE_REDUCE_ALL(ReduceChunked)
// cub::DeviceReduce with the operator's functor (narrow inputs through TransformReduce, so CUB
// accumulates in the operator's accumulator type). Every input type. Deterministic.
OPSERVE_DECLARE_REDUCE_ALL(ReduceCub)

// ---- Rows: [rows, cols] -> [rows] ----
// One thread per row. FLOAT32 only.
OPSERVE_DECLARE_ROW_REDUCE(RowReduceNaive, float)
// One block per row, unrolled independent loads; the block size is chosen from rows vs the SM
// count and from the row's bytes, as llama.cpp's reduce_rows_f32 does from its floats.
OPSERVE_DECLARE_ROW_REDUCE_ALL(RowReduceBlockPerRow)
// One warp (or group of lanes) per row: for short rows.
OPSERVE_DECLARE_ROW_REDUCE_ALL(RowReduceWarpPerRow)
// cub::DeviceSegmentedReduce with the operator's functor, the finish applied as CUB writes each
// row.
OPSERVE_DECLARE_ROW_REDUCE_ALL(RowReduceCubSegmented)

#undef OPSERVE_DECLARE_REDUCE
#undef OPSERVE_DECLARE_ROW_REDUCE
#undef OPSERVE_DECLARE_REDUCE_F32_I32
#undef OPSERVE_DECLARE_REDUCE_ALL
#undef OPSERVE_DECLARE_ROW_REDUCE_ALL

}  // namespace opserve::kernels
