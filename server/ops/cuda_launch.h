// Adapters from the op table's KernelArgs to the kernel layer's plain launchers: dtype dispatch,
// CUB-style temp storage from the request's scratch, and cudaError_t -> absl::Status. A row's
// run function passes its launcher (or, for a launcher overloaded by dtype, a lambda naming it)
// to one of the Run* below. Host C++ only (built by g++); the launchers live in kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "server/ops/op.h"
#include "common/status_macros.h"

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

// A launcher file declares overloads only for the dtypes its kernels run, and a row's lambda
// returns decltype(launcher(x...)), so a dtype without an overload is seen here rather than
// failing the build. Rows list the dtypes their launchers have and validation refuses the
// others; should a row list one its file lacks, the node fails with UNIMPLEMENTED before any
// device call (tests/unit/resolve_test.cc runs every listed pair).
inline absl::Status NoLauncher(const KernelArgs& a) {
  return absl::UnimplementedError(absl::StrCat("no launcher overload for ",
                                               a.input_meta[0].DebugString(), " -> ",
                                               a.output_meta.DebugString()));
}

// sum over In elements into one Out: FLOAT32 / BFLOAT16 -> FLOAT32, INT32 / INT64 -> INT64.
template <typename In, typename Out, typename F>
absl::Status RunSumAs(const KernelArgs& a, F f) {
  if constexpr (!std::is_invocable_v<F, void*, size_t*, const In*, Out*, int64_t, cudaStream_t>) {
    return NoLauncher(a);
  } else {
    const int64_t n = a.input_meta[0].NumElements();
    return RunWithTemp(a, [&](void* d_temp, size_t* bytes) {
      return f(d_temp, bytes, static_cast<const In*>(a.inputs[0]), static_cast<Out*>(a.output), n,
               Stream(a));
    });
  }
}

template <typename F>
absl::Status RunSum(const KernelArgs& a, F f) {
  switch (a.input_meta[0].dtype) {
    case DType::kInt32: return RunSumAs<int32_t, int64_t>(a, f);
    case DType::kInt64: return RunSumAs<int64_t, int64_t>(a, f);
    case DType::kBFloat16: return RunSumAs<kernels::bf16_bits, float>(a, f);
    default: return RunSumAs<float, float>(a, f);
  }
}

// row_sum / row_mean of In rows into Out: Out is the op's output dtype (INT64 for integer row
// sums, FLOAT32 otherwise: server/ops/row_reduce.cc).
template <typename In, typename Out, typename F>
absl::Status RunRowReduceAs(const KernelArgs& a, bool mean, F f) {
  if constexpr (!std::is_invocable_v<F, void*, size_t*, const In*, Out*, int64_t, int64_t, bool,
                                     cudaStream_t>) {
    return NoLauncher(a);
  } else {
    const int64_t rows = a.input_meta[0].shape[0], cols = a.input_meta[0].shape[1];
    return RunWithTemp(a, [&](void* d_temp, size_t* bytes) {
      return f(d_temp, bytes, static_cast<const In*>(a.inputs[0]), static_cast<Out*>(a.output),
               rows, cols, mean, Stream(a));
    });
  }
}

template <typename In, typename F>
absl::Status RunRowReduceFrom(const KernelArgs& a, bool mean, F f) {
  if (a.output_meta.dtype == DType::kInt64) return RunRowReduceAs<In, int64_t>(a, mean, f);
  return RunRowReduceAs<In, float>(a, mean, f);
}

template <typename F>
absl::Status RunRowReduce(const KernelArgs& a, bool mean, F f) {
  switch (a.input_meta[0].dtype) {
    case DType::kInt32: return RunRowReduceFrom<int32_t>(a, mean, f);
    case DType::kInt64: return RunRowReduceFrom<int64_t>(a, mean, f);
    case DType::kBFloat16: return RunRowReduceFrom<kernels::bf16_bits>(a, mean, f);
    default: return RunRowReduceFrom<float>(a, mean, f);
  }
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
