#include "tests/support/result_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/ops/op_util.h"

namespace opserve {
namespace {

// A matmul checked componentwise costs m * n * k host multiply-adds on top of the reference's;
// above this many the normwise error is taken instead, so that large cases stay quick.
constexpr int64_t kComponentwiseMaxWork = int64_t{1} << 26;

// An input element of any dtype as a double (INT64 beyond 2^53 rounds: it only scales errors).
double ValueAt(const void* bytes, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(bytes)[i];
    case DType::kBFloat16: return op_util::Bf16ToFloat(static_cast<const uint16_t*>(bytes)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(bytes)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(bytes)[i]);
    default: return 0;
  }
}

absl::Status NaNAt(int64_t i) {
  return absl::DataLossError(absl::StrCat("element ", i, " is NaN (never written?)"));
}

// |y - r| over the magnitude the output accumulates, sum |x| of its run (the mean of |x| for a
// mean), so that cancellation can neither hide a wrong answer nor fail a right one. An integer
// mean is the exact sum divided once, so it is measured the same way.
absl::StatusOr<double> ReductionError(const OpResult& c, const float* y, const float* r,
                                      bool mean) {
  const int64_t rows = c.output_meta.NumElements();
  if (rows == 0) return 0.0;
  const int64_t cols = c.input_meta[0].NumElements() / rows;
  double err = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (std::isnan(y[i])) return NaNAt(i);
    double abs_sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      abs_sum += std::fabs(ValueAt(c.inputs[0], c.input_meta[0].dtype, i * cols + j));
    }
    if (mean) abs_sum /= static_cast<double>(cols);
    err = std::max(err, std::fabs(static_cast<double>(y[i]) - r[i]) / std::max(abs_sum, 1e-300));
  }
  return err;
}

// |Y - R| <= tol * (|A| |B|) per element: meaningful even where a dot product cancels to
// nearly zero.
absl::StatusOr<double> ComponentwiseError(const OpResult& c, const float* y, const float* r) {
  const int64_t m = c.input_meta[0].shape[0], k = c.input_meta[0].shape[1];
  const int64_t n = c.input_meta[1].shape[1];
  const DType d = c.input_meta[0].dtype;
  double err = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (std::isnan(y[i * n + j])) return NaNAt(i * n + j);
      double abs_dot = 0;
      for (int64_t p = 0; p < k; ++p) {
        abs_dot +=
            std::fabs(ValueAt(c.inputs[0], d, i * k + p) * ValueAt(c.inputs[1], d, p * n + j));
      }
      const double diff = std::fabs(static_cast<double>(y[i * n + j]) - r[i * n + j]);
      err = std::max(err, diff / std::max(abs_dot, 1e-300));
    }
  }
  return err;
}

// ||Y - R|| / ||R||; an all-zero reference must be matched exactly.
absl::StatusOr<double> NormwiseError(int64_t n, const float* y, const float* r) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(y[i])) return NaNAt(i);
    const double d = static_cast<double>(y[i]) - r[i];
    diff += d * d;
    norm += static_cast<double>(r[i]) * r[i];
  }
  if (norm == 0) return diff == 0 ? 0.0 : HUGE_VAL;
  return std::sqrt(diff) / std::sqrt(norm);
}

}  // namespace

absl::StatusOr<double> RelativeError(const OpResult& c) {
  if (c.output_meta.dtype != DType::kFloat32 || c.op.test.error_scale == ErrorScale::kExact) {
    // Integer sums, copies such as transposes, and max / min (whose NaN is the canonical one on
    // every backend) are exact: equal bits, so neither a wrong NaN nor the poison passes.
    const uint64_t bytes = c.output_meta.Bytes(), size = ElementSize(c.output_meta.dtype);
    const char* got = static_cast<const char*>(c.got);
    const char* ref = static_cast<const char*>(c.reference);
    if (std::memcmp(got, ref, bytes) == 0) return 0.0;
    for (uint64_t i = 0; i < bytes; i += size) {
      if (std::memcmp(got + i, ref + i, size) != 0) {
        return absl::DataLossError(absl::StrCat("first mismatch at element ", i / size));
      }
    }
  }
  const auto* y = static_cast<const float*>(c.got);
  const auto* r = static_cast<const float*>(c.reference);
  switch (c.op.test.error_scale) {
    case ErrorScale::kReduction: return ReductionError(c, y, r, /*mean=*/false);
    case ErrorScale::kMean: return ReductionError(c, y, r, /*mean=*/true);
    case ErrorScale::kComponentwise:
      if (c.input_meta[0].NumElements() * c.input_meta[1].shape[1] <= kComponentwiseMaxWork) {
        return ComponentwiseError(c, y, r);
      }
      break;
    case ErrorScale::kNormwise: break;
    case ErrorScale::kExact: break;  // handled above
  }
  return NormwiseError(c.output_meta.NumElements(), y, r);
}

absl::Status CheckResult(const OpResult& c, absl::string_view algorithm) {
  const absl::StatusOr<double> err = RelativeError(c);
  if (!err.ok()) return err.status();
  const double tol = c.op.test.tolerance(algorithm, c.input_meta[0].dtype);
  // Written so that a NaN error fails too.
  if (!(*err <= tol)) {
    return absl::DataLossError(absl::StrCat("relative error ", *err, " over ", tol));
  }
  return absl::OkStatus();
}

}  // namespace opserve
