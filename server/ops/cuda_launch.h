// Adapters from the op table's KernelArgs to the kernel layer's plain launchers: dtype dispatch,
// CUB-style temp storage from the request's scratch, and cudaError_t -> absl::Status. A row's
// run function passes its launcher (or, for a launcher overloaded by dtype, a lambda naming it)
// to one of the Run* below (OPSERVE_LAUNCHER writes that lambda). Host C++ only (built by g++);
// the launchers live in kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "server/ops/op.h"
#include "common/status_macros.h"

namespace opserve::cuda {

// A launcher overload set as one callable whose return type is decltype(launcher(args...)), so
// that an argument list no overload takes is seen by std::is_invocable instead of failing the
// build: OPSERVE_LAUNCHER(kernels::ReduceVectorized<kernels::Max>).
#define OPSERVE_LAUNCHER(...) \
  [](auto... x) -> decltype(__VA_ARGS__(x...)) { return __VA_ARGS__(x...); }

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

// The reduction family (kernels/reduce.h). In is the input's element type, Out the output's, each
// read off its dtype; the launcher's overload set says which pairs exist (the operator fixes the
// output type: INT64 for an integer sum, FLOAT32 for a mean, the input's for max and min).

// A whole-tensor reduction of In elements into one Out.
template <typename In, typename Out, typename F>
absl::Status RunReduceAs(const KernelArgs& a, F f) {
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

// A row reduction of [rows, cols] In into [rows] Out.
template <typename In, typename Out, typename F>
absl::Status RunRowReduceAs(const KernelArgs& a, F f) {
  if constexpr (!std::is_invocable_v<F, void*, size_t*, const In*, Out*, int64_t, int64_t,
                                     cudaStream_t>) {
    return NoLauncher(a);
  } else {
    const int64_t rows = a.input_meta[0].shape[0], cols = a.input_meta[0].shape[1];
    return RunWithTemp(a, [&](void* d_temp, size_t* bytes) {
      return f(d_temp, bytes, static_cast<const In*>(a.inputs[0]), static_cast<Out*>(a.output),
               rows, cols, Stream(a));
    });
  }
}

// Calls run.template operator()<In, Out>() with the element types of the node's input and output
// dtypes (bf16 as its raw bits).
template <typename In, typename Run>
absl::Status WithOutputType(DType out, Run run) {
  switch (out) {
    case DType::kInt32: return run.template operator()<In, int32_t>();
    case DType::kInt64: return run.template operator()<In, int64_t>();
    case DType::kBFloat16: return run.template operator()<In, kernels::bf16_bits>();
    default: return run.template operator()<In, float>();
  }
}
template <typename Run>
absl::Status WithElementTypes(DType in, DType out, Run run) {
  switch (in) {
    case DType::kInt32: return WithOutputType<int32_t>(out, run);
    case DType::kInt64: return WithOutputType<int64_t>(out, run);
    case DType::kBFloat16: return WithOutputType<kernels::bf16_bits>(out, run);
    default: return WithOutputType<float>(out, run);
  }
}

template <typename F>
absl::Status RunReduce(const KernelArgs& a, F f) {
  return WithElementTypes(a.input_meta[0].dtype, a.output_meta.dtype,
                          [&]<typename In, typename Out>() { return RunReduceAs<In, Out>(a, f); });
}

template <typename F>
absl::Status RunRowReduce(const KernelArgs& a, F f) {
  const DType in = a.input_meta[0].dtype, out = a.output_meta.dtype;
  return WithElementTypes(in, out, [&]<typename In, typename Out>() {
    return RunRowReduceAs<In, Out>(a, f);
  });
}

// The column reduction fused for row_sum / row_mean(transpose(X)) (kernels/col_reduce.h), whose
// launcher takes the mean as a flag rather than as an operator.
template <typename F>
absl::Status RunRowReduce(const KernelArgs& a, bool mean, F f) {
  const DType in = a.input_meta[0].dtype, out = a.output_meta.dtype;
  return WithElementTypes(in, out, [&]<typename In, typename Out>() {
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
