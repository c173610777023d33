// row_sum / row_mean on the CPU, accumulated in float64 so the reference is far more accurate
// than any float32 kernel it checks.
#include "server/cpu/reference.h"

namespace opserve::cpu {
namespace {

void RowReduce(const KernelArgs& args, bool mean) {
  const int64_t rows = args.input_meta[0].shape[0], cols = args.input_meta[0].shape[1];
  const auto* x = static_cast<const float*>(args.inputs[0]);
  auto* y = static_cast<float*>(args.output);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    double s = 0.0;
    for (int64_t c = 0; c < cols; ++c) s += row[c];
    y[r] = static_cast<float>(mean ? s / static_cast<double>(cols) : s);
  }
}

}  // namespace

absl::Status RowSumReference(const KernelArgs& args) {
  RowReduce(args, /*mean=*/false);
  return absl::OkStatus();
}

absl::Status RowMeanReference(const KernelArgs& args) {
  RowReduce(args, /*mean=*/true);
  return absl::OkStatus();
}

}  // namespace opserve::cpu
