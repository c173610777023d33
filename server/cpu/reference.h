// The CPU reference backend's kernels: plain, exact-as-practical C++ over host memory. They are
// the backend CI runs and the reference every GPU algorithm is tested against.
#pragma once

#include <cstdint>
#include <cstring>

#include "server/ops.h"

namespace opserve::cpu {

absl::Status SumReference(const KernelArgs& args);
absl::Status RowSumReference(const KernelArgs& args);
absl::Status RowMeanReference(const KernelArgs& args);
absl::Status TransposeReference(const KernelArgs& args);
absl::Status MatmulReference(const KernelArgs& args);

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
