// sum on the CPU: FLOAT32 and BFLOAT16 pairwise in float32 (numpy's scheme: error grows with
// log n, not n); INT32 and INT64 exactly in int64, wrapping on overflow as numpy's int64 sum does.
#include <cstdint>

#include "server/cpu/reference.h"

namespace opserve::cpu {
namespace {

// Below this many elements a plain loop is as accurate as the tree and much faster.
constexpr int64_t kPairwiseBlock = 128;

template <typename T>
float Widen(T v) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return Bf16ToFloat(v);
  } else {
    return v;
  }
}

template <typename T>
float PairwiseSum(const T* x, int64_t n) {
  if (n <= kPairwiseBlock) {
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += Widen(x[i]);
    return s;
  }
  const int64_t half = n / 2;
  return PairwiseSum(x, half) + PairwiseSum(x + half, n - half);
}

}  // namespace

absl::Status SumReference(const KernelArgs& args) {
  const int64_t n = args.input_meta[0].NumElements();
  const void* x = args.inputs[0];
  switch (args.input_meta[0].dtype) {
    case DType::kInt32:
      *static_cast<int64_t*>(args.output) = ExactSum(static_cast<const int32_t*>(x), n);
      break;
    case DType::kInt64:
      *static_cast<int64_t*>(args.output) = ExactSum(static_cast<const int64_t*>(x), n);
      break;
    case DType::kBFloat16:
      *static_cast<float*>(args.output) = PairwiseSum(static_cast<const uint16_t*>(x), n);
      break;
    case DType::kFloat32:
      *static_cast<float*>(args.output) = PairwiseSum(static_cast<const float*>(x), n);
      break;
    default:
      return absl::InternalError("sum: unexpected dtype");
  }
  return absl::OkStatus();
}

}  // namespace opserve::cpu
