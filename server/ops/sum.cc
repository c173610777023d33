// sum: the full reduction of a tensor to a scalar, the Sum operator of the reduction family
// (server/ops/reduce_family.h, kernels/reduce.h). What is sum's own: its output dtype, the CPU
// reference, the atomic case of `auto` and its tolerance.
#include <cstdint>

#include "server/ops/op.h"
#include "server/ops/op_util.h"
#include "server/ops/reduce_family.h"

namespace opserve::ops {
namespace {

using D = DType;

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  return reduce_family::InferWhole(in, op_util::SumDType(in[0].dtype));
}

// ---- CPU reference: FLOAT32 and BFLOAT16 pairwise in float32 (numpy's scheme: the error grows
// with log n, not n); INT32 and INT64 exactly in int64, wrapping on overflow as numpy does.

// Below this many elements a plain loop is as accurate as the tree and much faster.
constexpr int64_t kPairwiseBlock = 128;

template <typename T>
float PairwiseSum(const T* x, int64_t n) {
  if (n <= kPairwiseBlock) {
    float s = 0.f;
    for (int64_t i = 0; i < n; ++i) s += op_util::Widen(x[i]);
    return s;
  }
  const int64_t half = n / 2;
  return PairwiseSum(x, half) + PairwiseSum(x + half, n - half);
}

absl::Status Reference(const KernelArgs& args) {
  const int64_t n = args.input_meta[0].NumElements();
  const void* x = args.inputs[0];
  switch (args.input_meta[0].dtype) {
    case D::kInt32:
      *static_cast<int64_t*>(args.output) = op_util::ExactSum(static_cast<const int32_t*>(x), n);
      break;
    case D::kInt64:
      *static_cast<int64_t*>(args.output) = op_util::ExactSum(static_cast<const int64_t*>(x), n);
      break;
    case D::kBFloat16:
      *static_cast<float*>(args.output) = PairwiseSum(static_cast<const uint16_t*>(x), n);
      break;
    case D::kFloat32:
      *static_cast<float*>(args.output) = PairwiseSum(static_cast<const float*>(x), n);
      break;
    default:
      return absl::InternalError("sum: unexpected dtype");
  }
  return absl::OkStatus();
}

#if OPSERVE_WITH_CUDA
// `auto`: small INT32 sums take one_pass_atomic: its int64 atomics are exact, so their order cannot
// change the result (deterministic in effect), and it is the fastest on small inputs; from
// kAtomicMaxInt32 elements vectorized streams faster and is the steadier of the two (the
// measurements: docs/performance/sum.md). one_pass_atomic is never chosen for floats, whose result
// would depend on the order of the atomics. Everything else as the family chooses by bytes
// (chunked for long streams, else vectorized).
constexpr int64_t kAtomicMaxInt32 = int64_t{1} << 22;
absl::string_view ChooseCuda(std::span<const TensorMeta> in, const DeviceProperties& device) {
  const absl::string_view family = reduce_family::ChooseWholeCuda(in, device);
  if (family == "vectorized" && in[0].dtype == D::kInt32 && in[0].NumElements() < kAtomicMaxInt32) {
    return "one_pass_atomic";
  }
  return family;
}
#endif

double Tolerance(absl::string_view, DType) { return 5e-5; }

}  // namespace

OpEntry SumOp() {
  return reduce_family::WholeEntry<kernels::Sum>({
      .name = "sum",
      .description = "full reduction to a scalar; INT32 / INT64 sum exactly into INT64 (wrapping "
                     "on overflow, as numpy), BFLOAT16 accumulates in FLOAT32 and returns "
                     "FLOAT32; the sum of nothing is 0",
      .infer = Infer,
      .reference = Reference,
      .reference_description = "pairwise float32 / exact int64",
      .empty_fill = EmptyFill::kZeros,
      .test = reduce_family::WholeModel(ErrorScale::kReduction, Tolerance),
#if OPSERVE_WITH_CUDA
      .cuda_auto = ChooseCuda,
#endif
  });
}

}  // namespace opserve::ops
