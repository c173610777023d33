// matmul: [M, K] x [K, N] -> FLOAT32 [M, N]. Everything about the op: its spec and shape rule,
// cost, the CPU reference, the CUDA rows and the test model (auto runs the default, cuBLAS).
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/ops/op.h"
#include "server/ops/op_util.h"

#if OPSERVE_WITH_CUDA
#include "kernels/matmul.h"
#include "server/ops/cuda_launch.h"
#endif

namespace opserve::ops {
namespace {

using D = DType;
constexpr D kTypes[] = {D::kFloat32, D::kBFloat16};

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  if (auto s = op_util::NeedDType(in[0], kTypes, "input 0 (A)"); !s.ok()) return s;
  if (auto s = op_util::NeedRank(in[0], 2, "input 0 (A) [M, K]"); !s.ok()) return s;
  if (auto s = op_util::NeedRank(in[1], 2, "input 1 (B) [K, N]"); !s.ok()) return s;
  if (in[1].dtype != in[0].dtype) {
    return absl::InvalidArgumentError(absl::StrCat("input 1 (B) must have A's dtype ",
                                                   DTypeName(in[0].dtype), ", got ",
                                                   in[1].DebugString()));
  }
  if (in[1].shape[0] != in[0].shape[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner dimensions differ: A is ", in[0].DebugString(), ", B is ",
                     in[1].DebugString(), " (expected B[0] == A[1] = ", in[0].shape[1], ")"));
  }
  // BFLOAT16 inputs accumulate and return in FLOAT32.
  return TensorMeta{D::kFloat32, {in[0].shape[0], in[1].shape[1]}};
}

Cost CostOf(std::span<const TensorMeta> in, const TensorMeta& out) {
  const uint64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  return {in[0].Bytes() + in[1].Bytes() + out.Bytes(), 2 * m * n * k};
}

// ---- CPU reference: float32 accumulation (BFLOAT16 widened first), i-k-j order so that the
// inner loop streams rows of B and C, rows split across hardware threads.

// Below this much work a thread costs more than it saves.
constexpr uint64_t kFlopsPerThread = 1 << 24;

template <typename T>
void MatmulRows(const T* a, const T* b, float* c, int64_t row_begin, int64_t row_end, int64_t n,
                int64_t k) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    float* c_row = c + i * n;
    std::fill(c_row, c_row + n, 0.f);
    for (int64_t p = 0; p < k; ++p) {
      const float a_ip = op_util::Widen(a[i * k + p]);
      const T* b_p = b + p * n;
      for (int64_t j = 0; j < n; ++j) c_row[j] += a_ip * op_util::Widen(b_p[j]);
    }
  }
}

template <typename T>
void Matmul(const T* a, const T* b, float* c, int64_t m, int64_t n, int64_t k) {
  const uint64_t flops = 2ull * m * n * k;
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads =
      std::clamp<int64_t>(static_cast<int64_t>(flops / kFlopsPerThread), 1, std::min(hw, m));
  if (threads == 1) {
    MatmulRows(a, b, c, 0, m, n, k);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (m + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * per, end = std::min(m, begin + per);
    if (begin < end) pool.emplace_back(MatmulRows<T>, a, b, c, begin, end, n, k);
  }
  for (auto& th : pool) th.join();
}

absl::Status Reference(const KernelArgs& args) {
  const int64_t m = args.input_meta[0].shape[0], k = args.input_meta[0].shape[1];
  const int64_t n = args.input_meta[1].shape[1];
  auto* c = static_cast<float*>(args.output);
  if (args.input_meta[0].dtype == D::kBFloat16) {
    Matmul(static_cast<const uint16_t*>(args.inputs[0]),
           static_cast<const uint16_t*>(args.inputs[1]), c, m, n, k);
  } else {
    Matmul(static_cast<const float*>(args.inputs[0]), static_cast<const float*>(args.inputs[1]),
           c, m, n, k);
  }
  return absl::OkStatus();
}

#if OPSERVE_WITH_CUDA
// ---- CUDA rows: each names its launcher; RunMatmul picks the FLOAT32 or BFLOAT16 overload.
absl::Status Naive(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulNaive(x...); });
}
absl::Status Coalescing(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulCoalescing(x...); });
}
absl::Status Tiled(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulTiled(x...); });
}
absl::Status TiledRegister(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulTiledRegister(x...); });
}
absl::Status BlockTiled(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulBlockTiled(x...); });
}
absl::Status BlockTiledVectorized(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulBlockTiledVectorized(x...); });
}
absl::Status WarpTiled(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulWarpTiled(x...); });
}
absl::Status TensorCore(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulTensorCore(x...); });
}
absl::Status TensorCoreSm90a(const KernelArgs& a) {
  return cuda::RunMatmul(a, [](auto... x) { return kernels::MatmulTensorCoreSm90a(x...); });
}
// With B still arriving from another GPU (a sharded matmul's broadcast), one GEMM per block of
// B's columns, each queued behind its block's arrival, so that the GEMM runs while the rest
// comes; each computes its columns of C whole.
absl::Status CublasArriving(const KernelArgs& a, const InputArrival& b) {
  const int64_t m = a.input_meta[0].shape[0], k = a.input_meta[0].shape[1];
  const int64_t n = a.input_meta[1].shape[1];
  const uint64_t elem = ElementSize(a.input_meta[1].dtype);
  bool whole_columns = b.row_bytes == static_cast<uint64_t>(n) * elem &&
                       b.rows == static_cast<uint64_t>(k) && !b.ends.empty();
  for (uint64_t end : b.ends) whole_columns = whole_columns && end % elem == 0;
  if (!whole_columns || m == 0 || n == 0) {  // blocks that split elements: wait for all of B
    if (!b.events.empty()) RETURN_IF_ERROR(a.env.AwaitArrival(b, b.events.size() - 1));
    return cuda::RunMatmul(
        a, [&](auto... x) { return kernels::MatmulCublas(a.env.blas_handle(), x...); });
  }
  const bool bf16 = a.input_meta[0].dtype == DType::kBFloat16;
  auto* c_out = static_cast<float*>(a.output);
  int64_t n_begin = 0;
  for (size_t c = 0; c < b.ends.size(); ++c) {
    const int64_t n_end = static_cast<int64_t>(b.ends[c] / elem);
    RETURN_IF_ERROR(a.env.AwaitArrival(b, c));
    const cudaError_t e =
        bf16 ? kernels::MatmulCublasColumns(
                   a.env.blas_handle(), static_cast<const kernels::bf16_bits*>(a.inputs[0]),
                   static_cast<const kernels::bf16_bits*>(a.inputs[1]), c_out, m, n, k, n_begin,
                   n_end, cuda::Stream(a))
             : kernels::MatmulCublasColumns(a.env.blas_handle(),
                                            static_cast<const float*>(a.inputs[0]),
                                            static_cast<const float*>(a.inputs[1]), c_out, m, n,
                                            k, n_begin, n_end, cuda::Stream(a));
    RETURN_IF_ERROR(cuda::FromCuda(e, "launch"));
    n_begin = n_end;
  }
  return absl::OkStatus();
}

absl::Status Cublas(const KernelArgs& a) {
  if (const InputArrival* b = a.env.arriving(1); b != nullptr) return CublasArriving(a, *b);
  return cuda::RunMatmul(a, [&](auto... x) { return kernels::MatmulCublas(a.env.blas_handle(), x...); });
}

// The shapes the sm_90a kernel takes; validation sends the others to its fallback row.
bool Sm90aTakes(std::span<const TensorMeta> in) {
  return kernels::MatmulTensorCoreSm90aSupports(in[0].shape[0], in[1].shape[1], in[0].shape[1],
                                                static_cast<int>(ElementSize(in[0].dtype)));
}
#endif

// Tensor cores round their inputs (TF32 keeps 10 mantissa bits, BF16 7): the bound follows.
double Tolerance(absl::string_view algorithm, DType dtype) {
  if (absl::StartsWith(algorithm, "tensor_core")) return dtype == D::kBFloat16 ? 1e-2 : 2e-3;
  return 5e-5;
}

}  // namespace

OpEntry MatmulOp() {
  const std::vector<D> types(std::begin(kTypes), std::end(kTypes));
  return OpEntry{
      .spec = {.name = "matmul",
               .description = "[M, K] x [K, N] -> FLOAT32 [M, N]; BFLOAT16 inputs accumulate in "
                              "FLOAT32; K = 0 gives zeros",
               .arity = 2,
               .dtypes = kTypes,
               .infer = Infer,
               .cost = CostOf,
               .empty_fill = EmptyFill::kZeros,
               .test = {.edge_shapes = {{{1, 1}, {1, 1}}, {{1, 17}, {17, 1}}, {{17, 1}, {1, 33}},
                                        {{33, 65}, {65, 17}}, {{64, 64}, {64, 64}},
                                        {{127, 129}, {129, 131}}, {{256, 256}, {256, 256}},
                                        {{128, 520}, {520, 136}}, {{1000, 513}, {513, 1001}}},
                        .large_shapes = {{{4095, 1023}, {1023, 4097}},
                                         // Large enough, and aligned, for the sm_90a wgmma
                                         // path: its edge tiles included.
                                         {{2048, 512}, {512, 2048}},
                                         {{4104, 1032}, {1032, 4112}}},
                        .small_shapes = {{{1, 1}, {1, 1}}, {{8, 16}, {16, 12}}, {{5, 33}, {33, 7}}},
                        .error_scale = ErrorScale::kComponentwise,
                        .tolerance = Tolerance}},
      .algorithms =
          {
              {.op = "matmul", .name = "reference", .backend = "cpu", .dtypes = types,
               .run = Reference, .is_default = true,
               .description = "i-k-j loops, float32 accumulation, rows across threads"},
#if OPSERVE_WITH_CUDA
              {.op = "matmul", .name = "naive", .backend = "cuda", .dtypes = types, .run = Naive,
               .min_compute_capability = kSm80,
               .description = "a thread per output"},
              {.op = "matmul", .name = "coalescing", .backend = "cuda", .dtypes = types,
               .run = Coalescing, .min_compute_capability = kSm80,
               .description = "coalesced global loads"},
              {.op = "matmul", .name = "tiled", .backend = "cuda", .dtypes = types, .run = Tiled,
               .min_compute_capability = kSm80,
               .description = "shared-memory tiles"},
              {.op = "matmul", .name = "tiled_register", .backend = "cuda", .dtypes = types,
               .run = TiledRegister, .min_compute_capability = kSm80,
               .description = "1-D register tiling"},
              {.op = "matmul", .name = "block_tiled", .backend = "cuda", .dtypes = types,
               .run = BlockTiled, .min_compute_capability = kSm80,
               .description = "2-D register tiling"},
              {.op = "matmul", .name = "block_tiled_vectorized", .backend = "cuda",
               .dtypes = types, .run = BlockTiledVectorized,
               .min_compute_capability = kSm80,
               .description = "2-D register tiling, 16-byte loads"},
              {.op = "matmul", .name = "warp_tiled", .backend = "cuda", .dtypes = types,
               .run = WarpTiled, .min_compute_capability = kSm80,
               .description = "warp tiles (64 x 64, 16 x 8 outputs a thread, 256 x 128 x 16 "
                              "block tiles; 64 x 32 warps in 128 x 64 tiles for small C), "
                              "double-buffered shared memory"},
              {.op = "matmul", .name = "tensor_core", .backend = "cuda", .dtypes = types,
               .run = TensorCore,
               .min_compute_capability = kSm80,
               .min_shared_memory_per_block = kernels::MatmulTensorCoreSharedBytes(),
               .description = "tensor cores through mma.sync: TF32 for FLOAT32, BF16 for "
                              "BFLOAT16"},
              {.op = "matmul", .name = "tensor_core_sm90a", .backend = "cuda", .dtypes = types,
               .run = TensorCoreSm90a, .min_compute_capability = kSm90,
               .max_compute_capability = kSm90,
               .description = "sm_90a wgmma fed by TMA, TF32 / BF16; shapes it does not take "
                              "(K < 256, under 128 tiles, rows not 16-byte multiples) run "
                              "tensor_core, reported as such",
               .supports = Sm90aTakes, .fallback = "tensor_core"},
              {.op = "matmul", .name = "cublas", .backend = "cuda", .dtypes = types,
               .run = Cublas, .is_default = true,
               .min_compute_capability = kSm80,
               .description = "cuBLAS SGEMM (full FP32) / GemmEx BF16; a B still arriving from "
                              "another GPU block by block as its columns land",
               .reads_arriving = true},
#endif
          },
  };
}

}  // namespace opserve::ops
