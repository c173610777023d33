// Shared conventions of the kernel layer (plain C++ + CUDA; no gRPC, protobuf or Abseil here).
//
// Every launcher:
//   - takes device pointers, sizes and an explicit cudaStream_t last;
//   - handles any size (ragged edges included), and any n >= 1 / rows, cols >= 1;
//   - returns cudaError_t, checking cudaPeekAtLastError() after its launches;
//   - never synchronizes the stream.
// Launchers that need scratch memory follow CUB's two-phase convention: called with
// d_temp == nullptr they only write the bytes they need to *temp_bytes and return cudaSuccess;
// called again with at least that much they run. Shape and dtype checks happen in the server's
// validation, before launch; launchers only guard against what would corrupt memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace opserve::kernels {

// bfloat16 crosses the plain-C++ boundary as its raw bits; .cu files reinterpret it as
// __nv_bfloat16.
using bf16_bits = uint16_t;

inline cudaError_t LastLaunchError() { return cudaPeekAtLastError(); }

// Ceil-divide for grid sizes.
template <typename T>
constexpr T CeilDiv(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace opserve::kernels
