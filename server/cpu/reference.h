// The CPU reference backend's kernels: plain, exact-as-practical C++ over host memory. They are
// the backend CI runs and the reference every GPU algorithm is tested against.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "server/ops.h"

namespace opserve::cpu {

absl::Status SumReference(const KernelArgs& args);
absl::Status RowSumReference(const KernelArgs& args);
absl::Status RowMeanReference(const KernelArgs& args);
absl::Status TransposeReference(const KernelArgs& args);
absl::Status MatmulReference(const KernelArgs& args);

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

}  // namespace opserve::cpu
