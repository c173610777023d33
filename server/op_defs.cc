// What each op means, independent of backend: dtype and shape rules, output shape, and the
// minimum bytes and FLOPs it costs. The algorithms that compute it are rows in op_table.cc.
#include "server/op_defs.h"

#include "absl/strings/str_cat.h"

namespace opserve::op_defs {
namespace {

absl::Status NeedRank(const TensorMeta& m, int rank, absl::string_view input) {
  if (m.rank() == rank) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(input), " must have rank ", rank, ", got ",
                                                 m.DebugString()));
}

absl::Status NeedDType(const TensorMeta& m, std::span<const DType> allowed,
                       absl::string_view input) {
  for (DType d : allowed) {
    if (m.dtype == d) return absl::OkStatus();
  }
  std::string names;
  for (DType d : allowed) absl::StrAppend(&names, names.empty() ? "" : " or ", std::string(DTypeName(d)));
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(input), " must be ", names, ", got ", m.DebugString()));
}

}  // namespace

namespace {

// What a sum of `in` elements is held in: integers exactly in INT64 (wrapping on overflow, as
// numpy's int64 sum does), floats in FLOAT32 (BFLOAT16 accumulates in FLOAT32).
DType SumDType(DType in) {
  return in == DType::kInt32 || in == DType::kInt64 ? DType::kInt64 : DType::kFloat32;
}

}  // namespace

absl::StatusOr<TensorMeta> InferSum(std::span<const TensorMeta> in) {
  if (auto s = NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  return TensorMeta{SumDType(in[0].dtype), {}};
}

Cost CostSum(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), static_cast<uint64_t>(in[0].NumElements())};
}

absl::StatusOr<TensorMeta> InferRowSum(std::span<const TensorMeta> in) {
  if (auto s = NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  if (auto s = NeedRank(in[0], 2, "input 0 [rows, cols]"); !s.ok()) return s;
  return TensorMeta{SumDType(in[0].dtype), {in[0].shape[0]}};
}

// The mean is FLOAT32 whatever the input: an integer row's sum is taken exactly, then divided.
absl::StatusOr<TensorMeta> InferRowMean(std::span<const TensorMeta> in) {
  if (auto s = NeedDType(in[0], kAllDTypes, "input 0"); !s.ok()) return s;
  if (auto s = NeedRank(in[0], 2, "input 0 [rows, cols]"); !s.ok()) return s;
  return TensorMeta{DType::kFloat32, {in[0].shape[0]}};
}

Cost CostRowReduce(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), static_cast<uint64_t>(in[0].NumElements())};
}

absl::StatusOr<TensorMeta> InferTranspose(std::span<const TensorMeta> in) {
  if (auto s = NeedRank(in[0], 2, "input 0 [rows, cols]"); !s.ok()) return s;
  return TensorMeta{in[0].dtype, {in[0].shape[1], in[0].shape[0]}};
}

Cost CostTranspose(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), 0};
}

absl::StatusOr<TensorMeta> InferMatmul(std::span<const TensorMeta> in) {
  static constexpr DType kOk[] = {DType::kFloat32, DType::kBFloat16};
  if (auto s = NeedDType(in[0], kOk, "input 0 (A)"); !s.ok()) return s;
  if (auto s = NeedRank(in[0], 2, "input 0 (A) [M, K]"); !s.ok()) return s;
  if (auto s = NeedRank(in[1], 2, "input 1 (B) [K, N]"); !s.ok()) return s;
  if (in[1].dtype != in[0].dtype) {
    return absl::InvalidArgumentError(absl::StrCat("input 1 (B) must have A's dtype ",
                                                   std::string(DTypeName(in[0].dtype)), ", got ",
                                                   in[1].DebugString()));
  }
  if (in[1].shape[0] != in[0].shape[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner dimensions differ: A is ", in[0].DebugString(), ", B is ",
                     in[1].DebugString(), " (expected B[0] == A[1] = ", in[0].shape[1], ")"));
  }
  // BFLOAT16 inputs accumulate and return in FLOAT32.
  return TensorMeta{DType::kFloat32, {in[0].shape[0], in[1].shape[1]}};
}

Cost CostMatmul(std::span<const TensorMeta> in, const TensorMeta& out) {
  const uint64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  return {in[0].Bytes() + in[1].Bytes() + out.Bytes(), 2 * m * n * k};
}

}  // namespace opserve::op_defs
