#include "server/ops/reduce_family.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/ops/op_util.h"

namespace opserve::ops::reduce_family {
namespace {

// numpy's words: "zero-size array to reduction operation maximum which has no identity".
absl::Status EmptyReduction(absl::string_view op, absl::string_view what, const TensorMeta& m) {
  return absl::InvalidArgumentError(absl::StrCat("zero-size ", what, " ", m.DebugString(),
                                                 " to reduction operation ", op,
                                                 ", which has no identity"));
}

// ---- max / min on the CPU ----
constexpr uint32_t kCanonicalNaN32 = 0x7FFFFFFFu;  // what the GPU's max.NaN.f32 gives

// IEEE 754-2019 maximum / minimum with the canonical NaN: any NaN gives it, -0.0 < +0.0.
template <Extremum kWhich>
float PickFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::bit_cast<float>(kCanonicalNaN32);
  if (a == b) {  // equal values differ only in the sign of a zero
    const bool a_negative = std::signbit(a);
    return (kWhich == Extremum::kMax) != a_negative ? a : b;
  }
  return (kWhich == Extremum::kMax ? a > b : a < b) ? a : b;
}

// The extremum of x[0, n), n >= 1, as the output element: bf16 (its bits) is decided in float
// and narrowed exactly, the canonical float NaN becoming bf16's 0x7FFF.
template <Extremum kWhich, typename T>
T ExtremumOf(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, uint16_t> || std::is_same_v<T, float>) {
    auto value = [&](int64_t i) { return static_cast<float>(op_util::Widen(x[i])); };
    float e = PickFloat<kWhich>(value(0), value(0));  // a lone NaN, made canonical too
    for (int64_t i = 1; i < n; ++i) e = PickFloat<kWhich>(e, value(i));
    if constexpr (std::is_same_v<T, uint16_t>) {
      return static_cast<uint16_t>(std::bit_cast<uint32_t>(e) >> 16);
    } else {
      return e;
    }
  } else {
    T e = x[0];
    for (int64_t i = 1; i < n; ++i) {
      if (kWhich == Extremum::kMax ? x[i] > e : x[i] < e) e = x[i];
    }
    return e;
  }
}

template <Extremum kWhich, typename T>
void Rows(const KernelArgs& a, int64_t rows, int64_t cols) {
  const auto* x = static_cast<const T*>(a.inputs[0]);
  auto* y = static_cast<T*>(a.output);
  for (int64_t r = 0; r < rows; ++r) y[r] = ExtremumOf<kWhich>(x + r * cols, cols);
}

template <Extremum kWhich>
absl::Status RunRows(const KernelArgs& a, int64_t rows, int64_t cols) {
  if (rows == 0) return absl::OkStatus();
  if (cols == 0) return absl::InternalError("max / min of an empty row: the shape rule refuses");
  switch (a.input_meta[0].dtype) {
    case DType::kFloat32: Rows<kWhich, float>(a, rows, cols); break;
    case DType::kBFloat16: Rows<kWhich, uint16_t>(a, rows, cols); break;
    case DType::kInt32: Rows<kWhich, int32_t>(a, rows, cols); break;
    case DType::kInt64: Rows<kWhich, int64_t>(a, rows, cols); break;
    default: return absl::InternalError("max / min: unexpected dtype");
  }
  return absl::OkStatus();
}

absl::Status RunRows(const KernelArgs& a, Extremum which, int64_t rows, int64_t cols) {
  return which == Extremum::kMax ? RunRows<Extremum::kMax>(a, rows, cols)
                                 : RunRows<Extremum::kMin>(a, rows, cols);
}

}  // namespace

absl::StatusOr<TensorMeta> InferWhole(std::span<const TensorMeta> in, DType out) {
  RETURN_IF_ERROR(op_util::NeedDType(in[0], kAllDTypes, "input 0"));
  return TensorMeta{out, {}};
}

absl::StatusOr<TensorMeta> InferRows(std::span<const TensorMeta> in, DType out) {
  RETURN_IF_ERROR(op_util::NeedDType(in[0], kAllDTypes, "input 0"));
  RETURN_IF_ERROR(op_util::NeedRank(in[0], 2, "input 0 [rows, cols]"));
  return TensorMeta{out, {in[0].shape[0]}};
}

absl::StatusOr<TensorMeta> InferWholeNoIdentity(absl::string_view op,
                                                std::span<const TensorMeta> in) {
  ASSIGN_OR_RETURN(TensorMeta out, InferWhole(in, in[0].dtype));
  if (in[0].NumElements() == 0) return EmptyReduction(op, "input 0", in[0]);
  return out;
}

absl::StatusOr<TensorMeta> InferRowsNoIdentity(absl::string_view op,
                                               std::span<const TensorMeta> in) {
  ASSIGN_OR_RETURN(TensorMeta out, InferRows(in, in[0].dtype));
  if (in[0].shape[0] > 0 && in[0].shape[1] == 0) {
    return EmptyReduction(op, "rows of input 0", in[0]);
  }
  return out;
}

Cost CostOf(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), static_cast<uint64_t>(in[0].NumElements())};
}

absl::Status ExtremumReference(const KernelArgs& args, Extremum which) {
  return RunRows(args, which, 1, args.input_meta[0].NumElements());
}

absl::Status RowExtremumReference(const KernelArgs& args, Extremum which) {
  return RunRows(args, which, args.input_meta[0].shape[0], args.input_meta[0].shape[1]);
}

// Whole tensor (the measurements behind the cut: docs/performance/sum.md): from kChunkedMinBytes
// chunked, which streams ~3% faster than vectorized, but whose completion counters and extra
// launch work cost a few microseconds that the 3% repays only on long streams. The cut is in
// bytes, the quantity the cost is repaid over.
constexpr uint64_t kChunkedMinBytes = uint64_t{1} << 29;
absl::string_view ChooseWholeCuda(std::span<const TensorMeta> in, const DeviceProperties&) {
  return in[0].Bytes() >= kChunkedMinBytes ? "chunked" : "vectorized";
}

// Rows, by shape (the measurements behind each cut: docs/performance/row_reduce.md):
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
constexpr int64_t kFewRowsPerSm = 2;          // llama.cpp's "nrows / nsm < 2"
constexpr int64_t kWarpPerRowMaxCols = 1023;  // llama.cpp's "ncols < 1024"
constexpr int64_t kCubMinCols = 2048;
constexpr int64_t kCubMaxCols = 8191;
absl::string_view ChooseRowsCuda(std::span<const TensorMeta> in, const DeviceProperties& device) {
  const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  const int64_t sms = device.sm_count() > 0 ? device.sm_count() : 1;
  if (rows < kFewRowsPerSm * sms) return "block_per_row";
  if (cols <= kWarpPerRowMaxCols) return "warp_per_row";
  if (cols >= kCubMinCols && cols <= kCubMaxCols) return "cub_segmented";
  return "block_per_row";
}

double ExactTolerance(absl::string_view, DType) { return 0; }

TestModel WholeModel(ErrorScale scale, double (*tolerance)(absl::string_view, DType)) {
  return {.edge_shapes = {{{1}}, {{2}}, {{31}}, {{33}}, {{1025}}, {{65537}}, {{3, 5, 7, 11}},
                          {{1000003}}, {{(1 << 24) + 3}}},
          // Over 1 GiB of FLOAT32/INT32: 2^28 + 1001 elements.
          .large_shapes = {{{(1 << 28) + 1001}}},
          .small_shapes = {{{}}, {{1}}, {{257}}, {{4, 33}}, {{2, 3, 5}}},
          .error_scale = scale,
          .tolerance = tolerance};
}

TestModel RowModel(ErrorScale scale, double (*tolerance)(absl::string_view, DType)) {
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
          .tolerance = tolerance};
}

OpEntry Entry(const Family& f, std::vector<AlgoSpec> cuda_rows) {
  OpEntry e{.spec = {.name = f.name,
                     .description = f.description,
                     .arity = 1,
                     .dtypes = kAllDTypes,
                     .infer = f.infer,
                     .cost = CostOf,
                     .empty_fill = f.empty_fill,
                     .test = f.test}};
  const std::vector<DType> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  e.algorithms.push_back({.op = f.name, .name = "reference", .backend = "cpu", .dtypes = all,
                          .run = f.reference, .is_default = true,
                          .description = f.reference_description});
  const bool has_cuda = !cuda_rows.empty();
  for (AlgoSpec& a : cuda_rows) e.algorithms.push_back(std::move(a));
  if (has_cuda && f.cuda_auto != nullptr) {
    e.auto_rules.push_back({f.name, "cuda", f.cuda_auto});
  }
  return e;
}

}  // namespace opserve::ops::reduce_family
