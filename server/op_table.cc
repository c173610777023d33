// THE table. Every op, and every algorithm of every backend: adding an algorithm is its kernel
// file plus one row here. ListOps, validation, `auto` and the tests all read these rows.
#include <algorithm>

#include "server/cpu/reference.h"
#include "server/op_defs.h"
#include "server/ops.h"

#if OPSERVE_WITH_CUDA
#include "kernels/matmul.h"
#include "kernels/row_reduce.h"
#include "kernels/row_reduce_auto.h"
#include "kernels/sum.h"
#include "kernels/transpose.h"
#include "server/cuda/launch.h"
#endif

namespace opserve {
namespace {

using D = DType;
constexpr D kMatmulTypes[] = {D::kFloat32, D::kBFloat16};

const OpSpec kOps[] = {
    {"sum",
     "full reduction to a scalar; INT32 / INT64 sum exactly into INT64 (wrapping on overflow, as "
     "numpy), BFLOAT16 accumulates in FLOAT32 and returns FLOAT32; the sum of nothing is 0",
     1, kAllDTypes, {}, op_defs::InferSum, op_defs::CostSum, EmptyFill::kZeros},
    {"row_sum",
     "[rows, cols] -> [rows], the sum of each row; the dtypes as for sum; [R, 0] gives R zeros", 1,
     kAllDTypes, {}, op_defs::InferRowSum, op_defs::CostRowReduce, EmptyFill::kZeros},
    {"row_mean",
     "[rows, cols] -> FLOAT32 [rows], the mean of each row (integer rows summed exactly, then "
     "divided); [R, 0] gives R NaNs",
     1, kAllDTypes, {}, op_defs::InferRowMean, op_defs::CostRowReduce, EmptyFill::kNaN},
    {"transpose", "[rows, cols] -> [cols, rows]", 1, kAllDTypes, {}, op_defs::InferTranspose,
     op_defs::CostTranspose, EmptyFill::kZeros},
    {"matmul",
     "[M, K] x [K, N] -> FLOAT32 [M, N]; BFLOAT16 inputs accumulate in FLOAT32; K = 0 gives zeros",
     2, kMatmulTypes, {}, op_defs::InferMatmul, op_defs::CostMatmul, EmptyFill::kZeros},
};


#if OPSERVE_WITH_CUDA
bool TmaDescribes(std::span<const TensorMeta> in) {
  return kernels::TransposeTmaSupports(in[0].shape[0], in[0].shape[1],
                                       static_cast<int>(ElementSize(in[0].dtype)));
}
bool Sm90aMatmulTakes(std::span<const TensorMeta> in) {
  return kernels::MatmulTensorCoreSm90aSupports(in[0].shape[0], in[1].shape[1], in[0].shape[1],
                                                static_cast<int>(ElementSize(in[0].dtype)));
}
#endif

const std::vector<AlgoSpec>& AlgorithmTable() {
  // Local, not a namespace-scope vector: tests build their case lists from the table during
  // static initialisation, possibly before another file's globals are constructed.
  const std::vector<D> kAll(std::begin(kAllDTypes), std::end(kAllDTypes));  // rows of every dtype
  static const auto* const kTable = new std::vector<AlgoSpec>{
      // op, algorithm, backend, input dtypes, run, deterministic, default, min cc, description
      {"sum", "reference", "cpu", kAll, cpu::SumReference, true, true, 0,
       "pairwise float32 / exact int64"},
      {"row_sum", "reference", "cpu", kAll, cpu::RowSumReference, true, true, 0,
       "float64 accumulation / exact int64"},
      {"row_mean", "reference", "cpu", kAll, cpu::RowMeanReference, true, true, 0,
       "float64 accumulation / exact int64, then divided"},
      {"transpose", "reference", "cpu", kAll, cpu::TransposeReference, true, true, 0, "64x64 cache tiles"},
      {"matmul", "reference", "cpu", {D::kFloat32, D::kBFloat16}, cpu::MatmulReference, true, true,
       0, "i-k-j loops, float32 accumulation, rows across threads"},
#if OPSERVE_WITH_CUDA
      {"sum", "two_pass", "cuda", {D::kFloat32, D::kInt32}, OPSERVE_CUDA_SUM(SumTwoPass), true,
       false, 0, "shared-memory tree per block, then a second launch"},
      {"sum", "warp_shuffle", "cuda", {D::kFloat32, D::kInt32}, OPSERVE_CUDA_SUM(SumWarpShuffle),
       true, false, 0, "the last warp reduces with shuffles"},
      {"sum", "one_pass_atomic", "cuda", {D::kFloat32, D::kInt32},
       OPSERVE_CUDA_SUM(SumOnePassAtomic), false, false, 0, "one launch, atomics across blocks"},
      {"sum", "vectorized", "cuda", kAll, OPSERVE_CUDA_SUM(SumVectorized),
       true, true, 0, "several 16-byte loads per thread in flight"},
      {"sum", "chunked", "cuda", kAll, OPSERVE_CUDA_SUM(SumChunked), true,
       false, 0, "a block per contiguous 16 KiB chunk, partials added in order by the last blocks"},
      {"sum", "cub", "cuda", kAll, OPSERVE_CUDA_SUM(SumCub), true, false, 0,
       "cub::DeviceReduce"},
      {"row_sum", "naive", "cuda", {D::kFloat32}, OPSERVE_CUDA_ROW(RowReduceNaive, false), true,
       false, 0, "a thread per row"},
      {"row_sum", "block_per_row", "cuda", kAll,
       OPSERVE_CUDA_ROW(RowReduceBlockPerRow, false), true, true, 0,
       "a block per row, unrolled independent loads"},
      {"row_sum", "warp_per_row", "cuda", kAll,
       OPSERVE_CUDA_ROW(RowReduceWarpPerRow, false), true, false, 0, "a warp per row"},
      {"row_sum", "cub_segmented", "cuda", kAll,
       OPSERVE_CUDA_ROW(RowReduceCubSegmented, false), true, false, 0,
       "cub::DeviceSegmentedReduce"},
      {"row_mean", "naive", "cuda", {D::kFloat32}, OPSERVE_CUDA_ROW(RowReduceNaive, true), true,
       false, 0, "a thread per row"},
      {"row_mean", "block_per_row", "cuda", kAll,
       OPSERVE_CUDA_ROW(RowReduceBlockPerRow, true), true, true, 0,
       "a block per row, unrolled independent loads"},
      {"row_mean", "warp_per_row", "cuda", kAll,
       OPSERVE_CUDA_ROW(RowReduceWarpPerRow, true), true, false, 0, "a warp per row"},
      {"row_mean", "cub_segmented", "cuda", kAll,
       OPSERVE_CUDA_ROW(RowReduceCubSegmented, true), true, false, 0,
       "cub::DeviceSegmentedReduce"},
      {"transpose", "naive", "cuda", kAll,
       OPSERVE_CUDA_TRANSPOSE(TransposeNaive), true, false, 0, "a thread per element"},
      {"transpose", "smem_tiled", "cuda", kAll,
       OPSERVE_CUDA_TRANSPOSE(TransposeSmemTiled), true, true, 0, "32x32 tile padded by one"},
      {"transpose", "swizzled", "cuda", kAll,
       OPSERVE_CUDA_TRANSPOSE(TransposeSwizzled), true, false, 0, "32x32 tile, XOR swizzle"},
      {"transpose", "tma", "cuda", {D::kFloat32, D::kInt32, D::kBFloat16},
       OPSERVE_CUDA_TRANSPOSE(TransposeTma), true, false, 90,
       "sm_90 bulk tensor copies, 128-byte swizzle, a CTA per tile; rows TMA cannot describe "
       "(not a 16-byte multiple) run smem_tiled, reported as such",
       /*supports=*/TmaDescribes, /*fallback=*/"smem_tiled"},
      {"matmul", "naive", "cuda", {D::kFloat32, D::kBFloat16}, OPSERVE_CUDA_MATMUL(MatmulNaive),
       true, false, 0, "a thread per output"},
      {"matmul", "coalescing", "cuda", {D::kFloat32, D::kBFloat16},
       OPSERVE_CUDA_MATMUL(MatmulCoalescing), true, false, 0, "coalesced global loads"},
      {"matmul", "tiled", "cuda", {D::kFloat32, D::kBFloat16}, OPSERVE_CUDA_MATMUL(MatmulTiled),
       true, false, 0, "shared-memory tiles"},
      {"matmul", "tiled_register", "cuda", {D::kFloat32, D::kBFloat16},
       OPSERVE_CUDA_MATMUL(MatmulTiledRegister), true, false, 0, "1-D register tiling"},
      {"matmul", "block_tiled", "cuda", {D::kFloat32, D::kBFloat16},
       OPSERVE_CUDA_MATMUL(MatmulBlockTiled), true, false, 0, "2-D register tiling"},
      {"matmul", "block_tiled_vectorized", "cuda", {D::kFloat32, D::kBFloat16},
       OPSERVE_CUDA_MATMUL(MatmulBlockTiledVectorized), true, false, 0,
       "2-D register tiling, 16-byte loads"},
      {"matmul", "tensor_core", "cuda", {D::kFloat32, D::kBFloat16},
       OPSERVE_CUDA_MATMUL(MatmulTensorCore), true, false, 0,
       "tensor cores through mma.sync: TF32 for FLOAT32, BF16 for BFLOAT16"},
      {"matmul", "tensor_core_sm90a", "cuda", {D::kFloat32, D::kBFloat16},
       OPSERVE_CUDA_MATMUL(MatmulTensorCoreSm90a), true, false, 90,
       "sm_90a wgmma fed by TMA, TF32 / BF16; shapes it does not take (K < 256, under 128 "
       "tiles, rows not 16-byte multiples) run tensor_core, reported as such",
       /*supports=*/Sm90aMatmulTakes, /*fallback=*/"tensor_core", /*max_compute_capability=*/90},
      {"matmul", "cublas", "cuda", {D::kFloat32, D::kBFloat16},
       [](const KernelArgs& a) {
         return cuda::RunMatmul(a, [&](auto... x) {
           return kernels::MatmulCublas(a.env.blas_handle(), x...);
         });
       },
       true, true, 0, "cuBLAS SGEMM (full FP32) / GemmEx BF16"},
#endif
  };
  return *kTable;
}

#if OPSERVE_WITH_CUDA
// sum's `auto` (the measurements behind each cut: kernels/NOTES_sum.md):
//  - from kSumChunkedMinBytes every dtype takes chunked: it streams ~3% faster than vectorized,
//    but its completion counters and extra launch work cost a few microseconds, which that 3%
//    repays only on long streams. The cut is in bytes, the quantity the cost is repaid over.
//  - below it, small INT32 sums take one_pass_atomic: its int64 atomics are exact, so their order
//    cannot change the result (deterministic in effect), and it is the fastest on small inputs;
//    from kSumAtomicMaxInt32 elements vectorized streams faster and is the steadier of the two.
//  - everything else takes vectorized, the fastest deterministic sum; one_pass_atomic is never
//    chosen for floats, whose result would depend on the order of the atomics.
constexpr uint64_t kSumChunkedMinBytes = uint64_t{1} << 29;
constexpr int64_t kSumAtomicMaxInt32 = int64_t{1} << 22;
absl::string_view ChooseSum(std::span<const TensorMeta> in, const Backend& backend) {
  const int64_t n = in[0].NumElements();
  if (in[0].Bytes() >= kSumChunkedMinBytes) return "chunked";
  if (in[0].dtype == DType::kInt32 && n < kSumAtomicMaxInt32) return "one_pass_atomic";
  return "vectorized";
}
absl::string_view ChooseRowReduce(std::span<const TensorMeta> in, const Backend& backend) {
  return kernels::ChooseRowReduceAlgorithm(in[0].shape[0], in[0].shape[1], backend.sm_count());
}
absl::string_view ChooseTranspose(std::span<const TensorMeta> in, const Backend& backend) {
  return backend.compute_capability() >= 90 ? "tma" : "smem_tiled";
}

const AutoRule kAutoRules[] = {
    {"sum", "cuda", ChooseSum},
    {"row_sum", "cuda", ChooseRowReduce},
    {"row_mean", "cuda", ChooseRowReduce},
    {"transpose", "cuda", ChooseTranspose},
};
#else
const std::span<const AutoRule> kAutoRules;
#endif

}  // namespace

std::span<const OpSpec> Ops() { return kOps; }
std::span<const AlgoSpec> Algorithms() { return AlgorithmTable(); }
std::span<const AutoRule> AutoRules() { return kAutoRules; }

}  // namespace opserve
