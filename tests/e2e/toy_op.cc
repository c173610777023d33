// toy_negate: y = -x, elementwise, any rank and every dtype, with a CPU row only. An op written
// outside server/ops/ the way an op file there is written (spec, shape rule, cost, CPU
// reference, rows, test model), which joins the table through RegisterOpFile instead of a line
// in registry.cc's kOpFiles. The toy server (server/main.cc built again with this file) serves
// it, and the contract tests run over it with no edit: what a new op costs outside the table.
#include <cstdint>
#include <vector>

#include "server/ops/op.h"
#include "server/ops/op_util.h"

namespace opserve::ops {
namespace {

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  if (auto s = op_util::NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  return in[0];
}

Cost CostOf(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), static_cast<uint64_t>(in[0].NumElements())};
}

// Integers negate modulo 2^N, as numpy's do (-INT32_MIN is INT32_MIN): in the unsigned type,
// where wrapping is defined.
template <typename T, typename U>
void NegateWrapping(const void* x, void* y, int64_t n) {
  const T* in = static_cast<const T*>(x);
  T* out = static_cast<T*>(y);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(U{0} - static_cast<U>(in[i]));
}

absl::Status Reference(const KernelArgs& args) {
  const int64_t n = args.input_meta[0].NumElements();
  const void* x = args.inputs[0];
  switch (args.input_meta[0].dtype) {
    case DType::kFloat32: {
      const float* in = static_cast<const float*>(x);
      float* out = static_cast<float*>(args.output);
      for (int64_t i = 0; i < n; ++i) out[i] = -in[i];
      break;
    }
    case DType::kInt32:
      NegateWrapping<int32_t, uint32_t>(x, args.output, n);
      break;
    case DType::kInt64:
      NegateWrapping<int64_t, uint64_t>(x, args.output, n);
      break;
    case DType::kBFloat16: {  // the sign bit, as float32's negation flips it
      const uint16_t* in = static_cast<const uint16_t*>(x);
      uint16_t* out = static_cast<uint16_t*>(args.output);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(in[i] ^ 0x8000u);
      break;
    }
    default:
      return absl::InternalError("toy_negate: unexpected dtype");
  }
  return absl::OkStatus();
}

// Negation is exact.
double Tolerance(absl::string_view, DType) { return 0; }

}  // namespace

OpEntry ToyNegateOp() {
  return OpEntry{
      .spec = {.name = "toy_negate",
               .description = "-x elementwise (a test's toy op); integers wrap as numpy's do",
               .arity = 1,
               .dtypes = kAllDTypes,
               .infer = Infer,
               .cost = CostOf,
               .empty_fill = EmptyFill::kZeros,
               .test = {.edge_shapes = {{{}}, {{1}}, {{33}}, {{3, 1025}}, {{2, 3, 5, 7}}},
                        .small_shapes = {{{}}, {{1}}, {{257}}, {{4, 33}}, {{2, 3, 5}}},
                        .error_scale = ErrorScale::kNormwise,
                        .tolerance = Tolerance}},
      .algorithms = {{.op = "toy_negate", .name = "reference", .backend = "cpu",
                      .dtypes = {std::begin(kAllDTypes), std::end(kAllDTypes)},
                      .run = Reference, .is_default = true,
                      .description = "a loop over the elements"}},
  };
}

namespace {
// The op file's one line of registration, as kOpFiles holds one for each built-in op file.
[[maybe_unused]] const bool kRegistered = RegisterOpFile(ToyNegateOp);
}  // namespace

}  // namespace opserve::ops
