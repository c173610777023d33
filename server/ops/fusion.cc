// The fusion rules (server/ops/op.h, FusionRule): patterns of two nodes the planner runs as one
// kernel, each with its kernels per backend and its test model. Adding a rule adds its kernel
// file and one entry to FusionEntries below; the planner (server/engine/fuse.cc) and the tests
// read this table.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "server/ops/op.h"
#include "server/ops/op_util.h"

#if OPSERVE_WITH_CUDA
#include "kernels/col_reduce.h"
#include "kernels/matmul.h"
#include "server/ops/cuda_launch.h"
#endif

namespace opserve::ops {
namespace {

using D = DType;

// ---- CPU: column sums and means of [rows, cols], each column accumulated over its rows in
// order, floats in float64 and integers exactly: the additions row_sum / row_mean's reference
// makes on the transpose, so the same bits, without writing the transpose.
template <typename T>
void ColReduce(const KernelArgs& args, bool mean) {
  const int64_t rows = args.input_meta[0].shape[0], cols = args.input_meta[0].shape[1];
  const auto* x = static_cast<const T*>(args.inputs[0]);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, uint16_t>) {
    std::vector<uint64_t> sum(cols, 0);  // wraps modulo 2^64, as op_util::ExactSum does
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) sum[c] += static_cast<uint64_t>(static_cast<int64_t>(x[r * cols + c]));
    }
    for (int64_t c = 0; c < cols; ++c) {
      const auto s = static_cast<int64_t>(sum[c]);
      if (mean) {
        static_cast<float*>(args.output)[c] =
            static_cast<float>(static_cast<double>(s) / static_cast<double>(rows));
      } else {
        static_cast<int64_t*>(args.output)[c] = s;
      }
    }
  } else {
    std::vector<double> sum(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) sum[c] += op_util::Widen(x[r * cols + c]);
    }
    for (int64_t c = 0; c < cols; ++c) {
      static_cast<float*>(args.output)[c] =
          static_cast<float>(mean ? sum[c] / static_cast<double>(rows) : sum[c]);
    }
  }
}

template <bool kMean>
absl::Status ColReduceCpu(const KernelArgs& args) {
  switch (args.input_meta[0].dtype) {
    case D::kFloat32: ColReduce<float>(args, kMean); break;
    case D::kBFloat16: ColReduce<uint16_t>(args, kMean); break;
    case D::kInt32: ColReduce<int32_t>(args, kMean); break;
    case D::kInt64: ColReduce<int64_t>(args, kMean); break;
    default: return absl::InternalError("column reduction: unexpected dtype");
  }
  return absl::OkStatus();
}

// ---- CPU: C^T = (A B)^T as matmul's reference computes C, then written transposed. The CPU
// backend is the reference: it keeps the unfused graph's bits rather than a faster loop.
absl::Status MatmulTransposedCpu(const KernelArgs& args) {
  const int64_t m = args.input_meta[0].shape[0], n = args.input_meta[1].shape[1];
  std::vector<float> c(static_cast<size_t>(m * n));
  const TensorMeta c_meta{D::kFloat32, {m, n}};
  const KernelArgs inner{args.inputs, args.input_meta, c.data(), c_meta, args.attrs, args.env};
  if (absl::Status s = CpuReference("matmul")->run(inner); !s.ok()) return s;
  auto* out = static_cast<float*>(args.output);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) out[j * m + i] = c[i * n + j];
  }
  return absl::OkStatus();
}

#if OPSERVE_WITH_CUDA
template <bool kMean>
absl::Status ColReduceCuda(const KernelArgs& a) {
  return cuda::RunRowReduce(a, kMean, [](auto... x) -> decltype(kernels::ColReduce(x...)) {
    return kernels::ColReduce(x...);
  });
}
absl::Status MatmulTransposedCuda(const KernelArgs& a) {
  return cuda::RunMatmul(a, [&](auto... x) {
    return kernels::MatmulCublasTransposed(a.env.blas_handle(), x...);
  });
}
#endif

const std::vector<std::vector<std::vector<int64_t>>> kMatrixShapes = {
    {{1, 1}}, {{1, 37}}, {{37, 1}}, {{33, 127}}, {{1000, 129}}, {{4097, 65}}, {{131, 4099}}, {{300, 8195}}};

template <bool kMean>
FusionRule ColReduceRule() {
  const std::vector<D> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  const absl::string_view name = kMean ? "fused:col_mean" : "fused:col_sum";
  const absl::string_view outer = kMean ? "row_mean" : "row_sum";
  return FusionRule{
      .name = name,
      .outer = outer,
      .inner = "transpose",
      .description = kMean ? "row_mean(transpose(X)): the mean of each column of X, read once"
                           : "row_sum(transpose(X)): the sum of each column of X, read once",
      .kernels =
          {
              {.op = outer, .name = name, .backend = "cpu", .dtypes = all,
               .run = ColReduceCpu<kMean>,
               .description = "each column accumulated in float64 / exact int64, rows in order"},
#if OPSERVE_WITH_CUDA
              {.op = outer, .name = name, .backend = "cuda", .dtypes = all,
               .run = ColReduceCuda<kMean>, .min_compute_capability = kSm80,
               .description = "a thread per 16-byte column vector over a chunk of rows, then "
                              "the chunks' sums added in order"},
#endif
          },
      .test = {.shapes = kMatrixShapes,
               // Inline in one request, so at most 128 MiB (INT64 4096^2); the bench times
               // 8192^2 and 65536 x 4096.
               .large_shapes = {{{4096, 4096}}, {{3, 1000003}}, {{1000003, 3}}},
               .tolerance = 2e-5,
               .cpu_bitwise = true},
  };
}

}  // namespace

std::vector<FusionRule> FusionEntries() {
  const std::vector<D> matmul_types = {D::kFloat32, D::kBFloat16};
  return {
      ColReduceRule<true>(),
      ColReduceRule<false>(),
      FusionRule{
          .name = "fused:matmul_t",
          .outer = "transpose",
          .inner = "matmul",
          .description = "transpose(matmul(A, B)): one GEMM that writes C^T (B^T A^T), no "
                         "transpose pass",
          .kernels =
              {
                  {.op = "transpose", .name = "fused:matmul_t", .backend = "cpu",
                   .dtypes = matmul_types, .run = MatmulTransposedCpu,
                   .description = "matmul's reference, then written transposed"},
#if OPSERVE_WITH_CUDA
                  // BFLOAT16 only: cuBLAS's pedantic SGEMM with both operands transposed ran
                  // 2-3% slower on the H200 at 4096^3 than the plain SGEMM and a transpose
                  // (PERFORMANCE.md), so FLOAT32 pairs stay two kernels there.
                  {.op = "transpose", .name = "fused:matmul_t", .backend = "cuda",
                   .dtypes = {D::kBFloat16}, .run = MatmulTransposedCuda,
                   .min_compute_capability = kSm80,
                   .description = "cuBLAS with both operands transposed: C^T in column-major "
                                  "is C^T's row-major bytes"},
#endif
              },
          .test = {.shapes = {{{1, 1}, {1, 1}}, {{17, 1}, {1, 33}}, {{33, 65}, {65, 17}},
                              {{127, 129}, {129, 131}}},
                   .large_shapes = {{{1024, 1024}, {1024, 1024}}, {{4095, 1023}, {1023, 4097}}},
                   .tolerance = 2e-5,
                   .cpu_bitwise = true},
      },
      FusionRule{
          .name = "fused:sum",
          .outer = "sum",
          .inner = "row_sum",
          .description = "sum(row_sum(X)): sum(X), one reduction of every element",
          .kernels = {},
          .test = {.shapes = kMatrixShapes,
                   .large_shapes = {{{4096, 4096}}, {{1, 1048577}}},
                   .tolerance = 2e-5,
                   .cpu_bitwise = false},
      },
  };
}

}  // namespace opserve::ops
