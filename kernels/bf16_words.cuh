// The two bfloat16 of a 32-bit word as floats, exactly: a bfloat16 is the top half of a float.
// The lower address holds the low half (little-endian). Shared by the reductions' 16-byte loads.
#pragma once

#include <cuda_runtime.h>

namespace opserve::kernels {

__device__ __forceinline__ float Bf16Lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float Bf16Hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace opserve::kernels
