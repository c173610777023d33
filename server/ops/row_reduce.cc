// row_sum and row_mean: [rows, cols] -> [rows]. Everything about the two ops: their specs and
// shape rules, cost, the CPU reference, the CUDA rows, `auto`'s choice and the test model.
#include <cstdint>
#include <type_traits>

#include "server/ops/op.h"
#include "server/ops/op_util.h"

#if OPSERVE_WITH_CUDA
#include "kernels/row_reduce.h"
#include "server/ops/cuda_launch.h"
#endif

namespace opserve::ops {
namespace {

using D = DType;

absl::StatusOr<TensorMeta> InferRowSum(std::span<const TensorMeta> in) {
  if (auto s = op_util::NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  if (auto s = op_util::NeedRank(in[0], 2, "input 0 [rows, cols]"); !s.ok()) return s;
  return TensorMeta{op_util::SumDType(in[0].dtype), {in[0].shape[0]}};
}

// The mean is FLOAT32 whatever the input: an integer row's sum is taken exactly, then divided.
absl::StatusOr<TensorMeta> InferRowMean(std::span<const TensorMeta> in) {
  if (auto s = op_util::NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  if (auto s = op_util::NeedRank(in[0], 2, "input 0 [rows, cols]"); !s.ok()) return s;
  return TensorMeta{D::kFloat32, {in[0].shape[0]}};
}

Cost CostOf(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), static_cast<uint64_t>(in[0].NumElements())};
}

// ---- CPU reference. Floats (BFLOAT16 widened) accumulate in float64, so the reference is far
// more accurate than any float32 kernel it checks; integers sum exactly in int64 (wrapping as
// numpy's does), and their mean is that sum divided in float64.

template <typename T>
double RowSumF64(const T* row, int64_t cols) {
  double s = 0.0;
  for (int64_t c = 0; c < cols; ++c) s += op_util::Widen(row[c]);
  return s;
}

template <typename T>
void RowReduce(const KernelArgs& args, bool mean) {
  const int64_t rows = args.input_meta[0].shape[0], cols = args.input_meta[0].shape[1];
  const auto* x = static_cast<const T*>(args.inputs[0]);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, uint16_t>) {
      const int64_t s = op_util::ExactSum(row, cols);
      if (mean) {
        static_cast<float*>(args.output)[r] =
            static_cast<float>(static_cast<double>(s) / static_cast<double>(cols));
      } else {
        static_cast<int64_t*>(args.output)[r] = s;
      }
    } else {
      const double s = RowSumF64(row, cols);
      static_cast<float*>(args.output)[r] =
          static_cast<float>(mean ? s / static_cast<double>(cols) : s);
    }
  }
}

absl::Status Reference(const KernelArgs& args, bool mean) {
  switch (args.input_meta[0].dtype) {
    case D::kFloat32: RowReduce<float>(args, mean); break;
    case D::kBFloat16: RowReduce<uint16_t>(args, mean); break;
    case D::kInt32: RowReduce<int32_t>(args, mean); break;
    case D::kInt64: RowReduce<int64_t>(args, mean); break;
    default: return absl::InternalError("row reduction: unexpected dtype");
  }
  return absl::OkStatus();
}
absl::Status RowSumReference(const KernelArgs& a) { return Reference(a, /*mean=*/false); }
absl::Status RowMeanReference(const KernelArgs& a) { return Reference(a, /*mean=*/true); }

#if OPSERVE_WITH_CUDA
// ---- CUDA rows: each names its launcher; RunRowReduce picks the overload for the node's
// dtypes (row_mean's output is FLOAT32, row_sum's as for sum).
template <bool kMean>
absl::Status Naive(const KernelArgs& a) {
  return cuda::RunRowReduce(a, kMean, [](auto... x) -> decltype(kernels::RowReduceNaive(x...)) {
    return kernels::RowReduceNaive(x...);
  });
}
template <bool kMean>
absl::Status BlockPerRow(const KernelArgs& a) {
  return cuda::RunRowReduce(a, kMean, [](auto... x) -> decltype(kernels::RowReduceBlockPerRow(x...)) {
    return kernels::RowReduceBlockPerRow(x...);
  });
}
template <bool kMean>
absl::Status WarpPerRow(const KernelArgs& a) {
  return cuda::RunRowReduce(a, kMean, [](auto... x) -> decltype(kernels::RowReduceWarpPerRow(x...)) {
    return kernels::RowReduceWarpPerRow(x...);
  });
}
template <bool kMean>
absl::Status CubSegmented(const KernelArgs& a) {
  return cuda::RunRowReduce(a, kMean,
                            [](auto... x) -> decltype(kernels::RowReduceCubSegmented(x...)) {
                              return kernels::RowReduceCubSegmented(x...);
                            });
}

// `auto`, by shape (the measurements behind each cut: docs/performance/row_reduce.md):
//  - fewer rows than kFewRowsPerSm per SM: block_per_row. Its launcher gives each row a
//    512-thread block and splits rows of >= 64K floats over several blocks, so few long rows
//    still fill every SM and few short rows cost one small launch.
//  - many rows of at most kWarpPerRowMaxCols: warp_per_row, a persistent grid with one warp or
//    sub-warp group per row (llama.cpp switches to a warp per row at the same 1024).
//  - many rows of kCubMinCols..kCubMaxCols: cub_segmented. There CUB's block-per-row kernel
//    already reads at the copy stream's rate, so no kernel of ours beats it by more than noise,
//    and taking CUB makes auto equal to that anchor by construction.
//  - many longer rows: block_per_row, whose 512-thread blocks read a 32 KiB row in one round of
//    loads.
//  naive is never chosen: it is the slow baseline.
constexpr int64_t kFewRowsPerSm = 2;            // llama.cpp's "nrows / nsm < 2"
constexpr int64_t kWarpPerRowMaxCols = 1023;    // llama.cpp's "ncols < 1024"
constexpr int64_t kCubMinCols = 2048;
constexpr int64_t kCubMaxCols = 8191;
absl::string_view ChooseCuda(std::span<const TensorMeta> in, const DeviceProperties& device) {
  const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  const int64_t sms = device.sm_count() > 0 ? device.sm_count() : 1;
  if (rows < kFewRowsPerSm * sms) return "block_per_row";
  if (cols <= kWarpPerRowMaxCols) return "warp_per_row";
  if (cols >= kCubMinCols && cols <= kCubMaxCols) return "cub_segmented";
  return "block_per_row";
}
#endif

double Tolerance(absl::string_view, DType) { return 5e-5; }

TestModel Model(ErrorScale scale) {
  return {.edge_shapes = {{{1, 1}}, {{1, 33}}, {{7, 1}}, {{10, 2048}}, {{33, 127}},
                          {{1000, 129}}, {{4097, 65}}, {{20000, 64}}, {{131, 4099}},
                          {{17, 65537}},
                          // Many rows of >= 8192 floats (block_per_row's 512-thread blocks), of
                          // odd length so that rows after the first start misaligned.
                          {{300, 8195}}},
          // Rows of a million elements, which the CUDA rows split over many blocks.
          .large_shapes = {{{1, 1048577}}, {{3, 1000003}}},
          .small_shapes = {{{1, 1}}, {{8, 33}}, {{3, 200}}},
          .error_scale = scale,
          .tolerance = Tolerance};
}

// The rows of one of the two ops (`mean` picks which).
template <bool kMean>
std::vector<AlgoSpec> Rows(absl::string_view op) {
  const std::vector<D> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  return {
      {.op = op, .name = "reference", .backend = "cpu", .dtypes = all,
       .run = kMean ? RowMeanReference : RowSumReference, .is_default = true,
       .description = kMean ? "float64 accumulation / exact int64, then divided"
                            : "float64 accumulation / exact int64"},
#if OPSERVE_WITH_CUDA
      {.op = op, .name = "naive", .backend = "cuda", .dtypes = {D::kFloat32},
       .run = Naive<kMean>, .min_compute_capability = kSm80, .description = "a thread per row"},
      {.op = op, .name = "block_per_row", .backend = "cuda", .dtypes = all,
       .run = BlockPerRow<kMean>, .is_default = true,
       .min_compute_capability = kSm80,
       .description = "a block per row, unrolled independent loads"},
      {.op = op, .name = "warp_per_row", .backend = "cuda", .dtypes = all,
       .run = WarpPerRow<kMean>, .min_compute_capability = kSm80, .description = "a warp per row"},
      {.op = op, .name = "cub_segmented", .backend = "cuda", .dtypes = all,
       .run = CubSegmented<kMean>, .min_compute_capability = kSm80,
       .description = "cub::DeviceSegmentedReduce"},
#endif
  };
}

}  // namespace

OpEntry RowSumOp() {
  return OpEntry{
      .spec = {.name = "row_sum",
               .description = "[rows, cols] -> [rows], the sum of each row; the dtypes as for "
                              "sum; [R, 0] gives R zeros",
               .arity = 1,
               .dtypes = kAllDTypes,
               .infer = InferRowSum,
               .cost = CostOf,
               .empty_fill = EmptyFill::kZeros,
               .test = Model(ErrorScale::kReduction)},
      .algorithms = Rows<false>("row_sum"),
#if OPSERVE_WITH_CUDA
      .auto_rules = {{"row_sum", "cuda", ChooseCuda}},
#endif
  };
}

OpEntry RowMeanOp() {
  return OpEntry{
      .spec = {.name = "row_mean",
               .description = "[rows, cols] -> FLOAT32 [rows], the mean of each row (integer "
                              "rows summed exactly, then divided); [R, 0] gives R NaNs",
               .arity = 1,
               .dtypes = kAllDTypes,
               .infer = InferRowMean,
               .cost = CostOf,
               .empty_fill = EmptyFill::kNaN,
               .test = Model(ErrorScale::kMean)},
      .algorithms = Rows<true>("row_mean"),
#if OPSERVE_WITH_CUDA
      .auto_rules = {{"row_mean", "cuda", ChooseCuda}},
#endif
  };
}

}  // namespace opserve::ops
