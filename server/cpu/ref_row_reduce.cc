// row_sum / row_mean on the CPU. Floats (BFLOAT16 widened) accumulate in float64, so the
// reference is far more accurate than any float32 kernel it checks; integers sum exactly in
// int64 (wrapping as numpy's does), and their mean is that sum divided in float64.
#include "server/cpu/reference.h"

namespace opserve::cpu {
namespace {

template <typename T>
double RowSumF64(const T* row, int64_t cols) {
  double s = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      s += Bf16ToFloat(row[c]);
    } else {
      s += row[c];
    }
  }
  return s;
}

template <typename T>
void RowReduce(const KernelArgs& args, bool mean) {
  const int64_t rows = args.input_meta[0].shape[0], cols = args.input_meta[0].shape[1];
  const auto* x = static_cast<const T*>(args.inputs[0]);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, uint16_t>) {
      const int64_t s = ExactSum(row, cols);
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

absl::Status RowReduceAny(const KernelArgs& args, bool mean) {
  switch (args.input_meta[0].dtype) {
    case DType::kFloat32: RowReduce<float>(args, mean); break;
    case DType::kBFloat16: RowReduce<uint16_t>(args, mean); break;
    case DType::kInt32: RowReduce<int32_t>(args, mean); break;
    case DType::kInt64: RowReduce<int64_t>(args, mean); break;
    default: return absl::InternalError("row reduction: unexpected dtype");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RowSumReference(const KernelArgs& args) { return RowReduceAny(args, /*mean=*/false); }

absl::Status RowMeanReference(const KernelArgs& args) { return RowReduceAny(args, /*mean=*/true); }

}  // namespace opserve::cpu
