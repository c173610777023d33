// Helpers the op files share: input checks for shape inference, and the arithmetic the CPU
// references need to be exact (int64 sums) and to read BFLOAT16.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/ops/tensor.h"

namespace opserve::op_util {

// INVALID_ARGUMENT "<input> must have rank <rank>, got <meta>" unless `m` has that rank.
absl::Status NeedRank(const TensorMeta& m, int rank, absl::string_view input);
// INVALID_ARGUMENT "<input> must be A or B, got <meta>" unless `m`'s dtype is allowed.
absl::Status NeedDType(const TensorMeta& m, std::span<const DType> allowed,
                       absl::string_view input);

// What a sum of `in` elements is held in: integers exactly in INT64 (wrapping on overflow, as
// numpy's int64 sum does), floats in FLOAT32 (BFLOAT16 accumulates in FLOAT32).
inline DType SumDType(DType in) {
  return in == DType::kInt32 || in == DType::kInt64 ? DType::kInt64 : DType::kFloat32;
}

// The exact int64 sum of n integers, wrapping modulo 2^64 on overflow (numpy's int64 sum): the
// adds run in uint64, where wrapping is defined, not in int64, where overflow is undefined.
template <typename T>
int64_t ExactSum(const T* x, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<uint64_t>(static_cast<int64_t>(x[i]));
  return static_cast<int64_t>(s);
}

// bfloat16 is the top half of a float32.
inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// An element as float: BFLOAT16 (its bits, uint16_t) widened, other types converted.
template <typename T>
float Widen(T v) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return Bf16ToFloat(v);
  } else {
    return static_cast<float>(v);
  }
}

}  // namespace opserve::op_util
