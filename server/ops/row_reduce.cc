// row_sum and row_mean: [rows, cols] -> [rows], the Sum and Mean operators of the reduction
// family (server/ops/reduce_family.h, kernels/reduce.h). What is theirs: the output dtypes, the
// CPU reference they share, and the tolerance.
#include <cstdint>
#include <type_traits>

#include "server/ops/op.h"
#include "server/ops/op_util.h"
#include "server/ops/reduce_family.h"

namespace opserve::ops {
namespace {

using D = DType;

absl::StatusOr<TensorMeta> InferRowSum(std::span<const TensorMeta> in) {
  return reduce_family::InferRows(in, op_util::SumDType(in[0].dtype));
}

// The mean is FLOAT32 whatever the input: an integer row's sum is taken exactly, then divided.
absl::StatusOr<TensorMeta> InferRowMean(std::span<const TensorMeta> in) {
  return reduce_family::InferRows(in, D::kFloat32);
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

double Tolerance(absl::string_view, DType) { return 5e-5; }

}  // namespace

OpEntry RowSumOp() {
  return reduce_family::RowEntry<kernels::Sum>({
      .name = "row_sum",
      .description = "[rows, cols] -> [rows], the sum of each row; the dtypes as for sum; [R, 0] "
                     "gives R zeros",
      .infer = InferRowSum,
      .reference = RowSumReference,
      .reference_description = "float64 accumulation / exact int64",
      .empty_fill = EmptyFill::kZeros,
      .test = reduce_family::RowModel(ErrorScale::kReduction, Tolerance),
      .cuda_auto = reduce_family::ChooseRowsCuda,
  });
}

OpEntry RowMeanOp() {
  return reduce_family::RowEntry<kernels::Mean>({
      .name = "row_mean",
      .description = "[rows, cols] -> FLOAT32 [rows], the mean of each row (integer rows summed "
                     "exactly, then divided); [R, 0] gives R NaNs",
      .infer = InferRowMean,
      .reference = RowMeanReference,
      .reference_description = "float64 accumulation / exact int64, then divided",
      .empty_fill = EmptyFill::kNaN,
      .test = reduce_family::RowModel(ErrorScale::kMean, Tolerance),
      .cuda_auto = reduce_family::ChooseRowsCuda,
  });
}

}  // namespace opserve::ops
