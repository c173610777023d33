// Adapters from the op table's KernelArgs to the kernel layer's plain launchers: dtype dispatch,
// CUB-style temp storage from the request's scratch, and cudaError_t -> absl::Status.
// Host C++ only (built by g++); the launchers live in kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "server/ops.h"
#include "server/status_macros.h"

namespace opserve::cuda {

inline absl::Status FromCuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

inline cudaStream_t Stream(const KernelArgs& a) { return static_cast<cudaStream_t>(a.env.stream()); }

// Runs a two-phase launcher: asks for its temp bytes, takes them from scratch, runs it.
template <typename Launch>
absl::Status RunWithTemp(const KernelArgs& a, Launch launch) {
  size_t temp_bytes = 0;
  RETURN_IF_ERROR(FromCuda(launch(nullptr, &temp_bytes), "temp size query"));
  // Never pass nullptr on the second call: that would be another size query (CUB's rule).
  void* d_temp = nullptr;
  ASSIGN_OR_RETURN(d_temp, a.env.Scratch(temp_bytes > 0 ? temp_bytes : 1));
  return FromCuda(launch(d_temp, &temp_bytes), "launch");
}

template <typename F>
absl::Status RunSum(const KernelArgs& a, F f) {
  const int64_t n = a.input_meta[0].NumElements();
  return RunWithTemp(a, [&](void* d_temp, size_t* bytes) {
    if (a.input_meta[0].dtype == DType::kInt32) {
      return f(d_temp, bytes, static_cast<const int32_t*>(a.inputs[0]),
               static_cast<int64_t*>(a.output), n, Stream(a));
    }
    return f(d_temp, bytes, static_cast<const float*>(a.inputs[0]), static_cast<float*>(a.output),
             n, Stream(a));
  });
}

template <typename F>
absl::Status RunRowReduce(const KernelArgs& a, bool mean, F f) {
  const int64_t rows = a.input_meta[0].shape[0], cols = a.input_meta[0].shape[1];
  return RunWithTemp(a, [&](void* d_temp, size_t* bytes) {
    return f(d_temp, bytes, static_cast<const float*>(a.inputs[0]), static_cast<float*>(a.output),
             rows, cols, mean, Stream(a));
  });
}

template <typename F>
absl::Status RunTranspose(const KernelArgs& a, F f) {
  const TensorMeta& in = a.input_meta[0];
  return FromCuda(f(a.inputs[0], a.output, in.shape[0], in.shape[1],
                    static_cast<int>(ElementSize(in.dtype)), Stream(a)),
                  "launch");
}

template <typename F>
absl::Status RunMatmul(const KernelArgs& a, F f) {
  const int64_t m = a.input_meta[0].shape[0], k = a.input_meta[0].shape[1];
  const int64_t n = a.input_meta[1].shape[1];
  auto* c = static_cast<float*>(a.output);
  if (a.input_meta[0].dtype == DType::kBFloat16) {
    using kernels::bf16_bits;
    return FromCuda(f(static_cast<const bf16_bits*>(a.inputs[0]),
                      static_cast<const bf16_bits*>(a.inputs[1]), c, m, n, k, Stream(a)),
                    "launch");
  }
  return FromCuda(f(static_cast<const float*>(a.inputs[0]), static_cast<const float*>(a.inputs[1]),
                    c, m, n, k, Stream(a)),
                  "launch");
}

}  // namespace opserve::cuda

// Table-row helpers: a captureless lambda per algorithm, so each row stays one line.
#define OPSERVE_CUDA_SUM(fn) \
  [](const KernelArgs& a) { return cuda::RunSum(a, [](auto... x) { return kernels::fn(x...); }); }
#define OPSERVE_CUDA_ROW(fn, mean)                                                    \
  [](const KernelArgs& a) {                                                           \
    return cuda::RunRowReduce(a, mean, [](auto... x) { return kernels::fn(x...); }); \
  }
#define OPSERVE_CUDA_TRANSPOSE(fn)                                                       \
  [](const KernelArgs& a) {                                                              \
    return cuda::RunTranspose(a, [](auto... x) { return kernels::fn(x...); });           \
  }
#define OPSERVE_CUDA_MATMUL(fn)                                                          \
  [](const KernelArgs& a) {                                                              \
    return cuda::RunMatmul(a, [](auto... x) { return kernels::fn(x...); });              \
  }
