// sum: the full reduction of a tensor to a scalar. Everything about the op: its spec and shape
// rule, its cost, the CPU reference, the CUDA rows, `auto`'s choice and the test model.
#include <cstdint>
#include <type_traits>

#include "server/ops/op.h"
#include "server/ops/op_util.h"

#if OPSERVE_WITH_CUDA
#include "kernels/sum.h"
#include "server/ops/cuda_launch.h"
#endif

namespace opserve::ops {
namespace {

using D = DType;

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  if (auto s = op_util::NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  return TensorMeta{op_util::SumDType(in[0].dtype), {}};
}

Cost CostOf(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), static_cast<uint64_t>(in[0].NumElements())};
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
// ---- CUDA rows: each names its launcher; RunSum picks the overload for the node's dtypes.
absl::Status TwoPass(const KernelArgs& a) {
  return cuda::RunSum(a, [](auto... x) -> decltype(kernels::SumTwoPass(x...)) {
    return kernels::SumTwoPass(x...);
  });
}
absl::Status WarpShuffle(const KernelArgs& a) {
  return cuda::RunSum(a, [](auto... x) -> decltype(kernels::SumWarpShuffle(x...)) {
    return kernels::SumWarpShuffle(x...);
  });
}
absl::Status OnePassAtomic(const KernelArgs& a) {
  return cuda::RunSum(a, [](auto... x) -> decltype(kernels::SumOnePassAtomic(x...)) {
    return kernels::SumOnePassAtomic(x...);
  });
}
absl::Status Vectorized(const KernelArgs& a) {
  return cuda::RunSum(a, [](auto... x) -> decltype(kernels::SumVectorized(x...)) {
    return kernels::SumVectorized(x...);
  });
}
absl::Status Chunked(const KernelArgs& a) {
  return cuda::RunSum(a, [](auto... x) -> decltype(kernels::SumChunked(x...)) {
    return kernels::SumChunked(x...);
  });
}
absl::Status Cub(const KernelArgs& a) {
  return cuda::RunSum(a, [](auto... x) -> decltype(kernels::SumCub(x...)) {
    return kernels::SumCub(x...);
  });
}

// `auto` (the measurements behind each cut: docs/performance/sum.md):
//  - from kChunkedMinBytes every dtype takes chunked: it streams ~3% faster than vectorized,
//    but its completion counters and extra launch work cost a few microseconds, which that 3%
//    repays only on long streams. The cut is in bytes, the quantity the cost is repaid over.
//  - below it, small INT32 sums take one_pass_atomic: its int64 atomics are exact, so their order
//    cannot change the result (deterministic in effect), and it is the fastest on small inputs;
//    from kAtomicMaxInt32 elements vectorized streams faster and is the steadier of the two.
//  - everything else takes vectorized, the fastest deterministic sum; one_pass_atomic is never
//    chosen for floats, whose result would depend on the order of the atomics.
constexpr uint64_t kChunkedMinBytes = uint64_t{1} << 29;
constexpr int64_t kAtomicMaxInt32 = int64_t{1} << 22;
absl::string_view ChooseCuda(std::span<const TensorMeta> in, const DeviceProperties&) {
  if (in[0].Bytes() >= kChunkedMinBytes) return "chunked";
  if (in[0].dtype == D::kInt32 && in[0].NumElements() < kAtomicMaxInt32) return "one_pass_atomic";
  return "vectorized";
}
#endif

double Tolerance(absl::string_view, DType) { return 5e-5; }

}  // namespace

OpEntry SumOp() {
  const std::vector<D> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  const std::vector<D> f32_i32 = {D::kFloat32, D::kInt32};
  return OpEntry{
      .spec =
          {.name = "sum",
           .description =
               "full reduction to a scalar; INT32 / INT64 sum exactly into INT64 (wrapping on "
               "overflow, as numpy), BFLOAT16 accumulates in FLOAT32 and returns FLOAT32; the sum "
               "of nothing is 0",
           .arity = 1,
           .dtypes = kAllDTypes,
           .infer = Infer,
           .cost = CostOf,
           .empty_fill = EmptyFill::kZeros,
           .test = {.edge_shapes = {{{1}}, {{2}}, {{31}}, {{33}}, {{1025}}, {{65537}},
                                    {{3, 5, 7, 11}}, {{1000003}}, {{(1 << 24) + 3}}},
                    // Over 1 GiB of FLOAT32/INT32: 2^28 + 1001 elements.
                    .large_shapes = {{{(1 << 28) + 1001}}},
                    .small_shapes = {{{}}, {{1}}, {{257}}, {{4, 33}}, {{2, 3, 5}}},
                    .error_scale = ErrorScale::kReduction,
                    .tolerance = Tolerance}},
      .algorithms =
          {
              {.op = "sum", .name = "reference", .backend = "cpu", .dtypes = all,
               .run = Reference, .is_default = true,
               .description = "pairwise float32 / exact int64"},
#if OPSERVE_WITH_CUDA
              {.op = "sum", .name = "two_pass", .backend = "cuda", .dtypes = f32_i32,
               .run = TwoPass,
               .min_compute_capability = kSm80,
               .description = "shared-memory tree per block, then a second launch"},
              {.op = "sum", .name = "warp_shuffle", .backend = "cuda", .dtypes = f32_i32,
               .run = WarpShuffle, .min_compute_capability = kSm80,
               .description = "the last warp reduces with shuffles"},
              {.op = "sum", .name = "one_pass_atomic", .backend = "cuda", .dtypes = f32_i32,
               .run = OnePassAtomic, .deterministic = false,
               .min_compute_capability = kSm80,
               .description = "one launch, atomics across blocks"},
              {.op = "sum", .name = "vectorized", .backend = "cuda", .dtypes = all,
               .run = Vectorized, .is_default = true,
               .min_compute_capability = kSm80,
               .description = "several 16-byte loads per thread in flight"},
              {.op = "sum", .name = "chunked", .backend = "cuda", .dtypes = all, .run = Chunked,
               .min_compute_capability = kSm80,
               .description = "a block per contiguous 16 KiB chunk, partials added in order by "
                              "the last blocks"},
              {.op = "sum", .name = "cub", .backend = "cuda", .dtypes = all, .run = Cub,
               .min_compute_capability = kSm80,
               .description = "cub::DeviceReduce"},
#endif
          },
#if OPSERVE_WITH_CUDA
      .auto_rules = {{"sum", "cuda", ChooseCuda}},
#endif
  };
}

}  // namespace opserve::ops
