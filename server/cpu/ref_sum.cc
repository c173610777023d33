// sum on the CPU: FLOAT32 pairwise in float32 (numpy's scheme: error grows with log n, not n);
// INT32 exactly in int64.
#include <cstdint>

#include "server/cpu/reference.h"

namespace opserve::cpu {
namespace {

// Below this many elements a plain loop is as accurate as the tree and much faster.
constexpr int64_t kPairwiseBlock = 128;

float PairwiseSum(const float* x, int64_t n) {
  if (n <= kPairwiseBlock) {
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
  const int64_t half = n / 2;
  return PairwiseSum(x, half) + PairwiseSum(x + half, n - half);
}

}  // namespace

absl::Status SumReference(const KernelArgs& args) {
  const int64_t n = args.input_meta[0].NumElements();
  if (args.input_meta[0].dtype == DType::kInt32) {
    const auto* x = static_cast<const int32_t*>(args.inputs[0]);
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    *static_cast<int64_t*>(args.output) = s;
  } else {
    *static_cast<float*>(args.output) = PairwiseSum(static_cast<const float*>(args.inputs[0]), n);
  }
  return absl::OkStatus();
}

}  // namespace opserve::cpu
