// transpose: [rows, cols] -> [cols, rows] for every dtype. Everything about the op: its spec and
// shape rule, cost, the CPU reference, the CUDA rows, `auto`'s choice and the test model.
#include <algorithm>
#include <cstdint>

#include "server/ops/op.h"
#include "server/ops/op_util.h"

#if OPSERVE_WITH_CUDA
#include "kernels/transpose.h"
#include "server/ops/cuda_launch.h"
#endif

namespace opserve::ops {
namespace {

using D = DType;

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  if (auto s = op_util::NeedRank(in[0], 2, "input 0 [rows, cols]"); !s.ok()) return s;
  return TensorMeta{in[0].dtype, {in[0].shape[1], in[0].shape[0]}};
}

Cost CostOf(std::span<const TensorMeta> in, const TensorMeta& out) {
  return {in[0].Bytes() + out.Bytes(), 0};
}

// ---- CPU reference, in cache-sized tiles: 64 x 64 elements of 8 bytes is 32 KiB a side, so a
// tile's rows and columns stay in L1/L2.
constexpr int64_t kTile = 64;

template <typename T>
void TransposeTiled(const T* in, T* out, int64_t rows, int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

absl::Status Reference(const KernelArgs& args) {
  const int64_t rows = args.input_meta[0].shape[0], cols = args.input_meta[0].shape[1];
  switch (ElementSize(args.input_meta[0].dtype)) {
    case 2:
      TransposeTiled(static_cast<const uint16_t*>(args.inputs[0]),
                     static_cast<uint16_t*>(args.output), rows, cols);
      break;
    case 4:
      TransposeTiled(static_cast<const uint32_t*>(args.inputs[0]),
                     static_cast<uint32_t*>(args.output), rows, cols);
      break;
    case 8:
      TransposeTiled(static_cast<const uint64_t*>(args.inputs[0]),
                     static_cast<uint64_t*>(args.output), rows, cols);
      break;
    default:
      return absl::InternalError("transpose: unexpected element size");
  }
  return absl::OkStatus();
}

#if OPSERVE_WITH_CUDA
// ---- CUDA rows: the launchers take any element size, so each row passes its launcher itself.
absl::Status Naive(const KernelArgs& a) { return cuda::RunTranspose(a, kernels::TransposeNaive); }
absl::Status SmemTiled(const KernelArgs& a) {
  return cuda::RunTranspose(a, kernels::TransposeSmemTiled);
}
absl::Status Swizzled(const KernelArgs& a) {
  return cuda::RunTranspose(a, kernels::TransposeSwizzled);
}
absl::Status Tma(const KernelArgs& a) { return cuda::RunTranspose(a, kernels::TransposeTma); }

// The shapes the TMA kernel takes; validation sends the others to its fallback row.
bool TmaDescribes(std::span<const TensorMeta> in) {
  return kernels::TransposeTmaSupports(in[0].shape[0], in[0].shape[1],
                                       static_cast<int>(ElementSize(in[0].dtype)));
}

// `auto`: the TMA kernel where the device runs its row (bulk tensor copies), else smem_tiled.
absl::string_view ChooseCuda(std::span<const TensorMeta>, const DeviceProperties& device) {
  return FindAlgorithm("transpose", "tma", device) != nullptr ? "tma" : "smem_tiled";
}
#endif

// A transpose copies elements: any difference at all is a wrong answer.
double Tolerance(absl::string_view, DType) { return 0; }

}  // namespace

OpEntry TransposeOp() {
  const std::vector<D> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  return OpEntry{
      .spec = {.name = "transpose",
               .description = "[rows, cols] -> [cols, rows]",
               .arity = 1,
               .dtypes = kAllDTypes,
               .infer = Infer,
               .cost = CostOf,
               .empty_fill = EmptyFill::kZeros,
               .test = {.edge_shapes = {{{1, 1}}, {{1, 37}}, {{37, 1}}, {{31, 33}}, {{33, 31}},
                                        {{64, 64}}, {{65, 129}}, {{128, 96}}, {{1000, 1001}},
                                        {{3000, 7}},
                                        // TMA input walked column-major with a partial last
                                        // tile both ways: with element stores (rows * 4 % 16
                                        // != 0), and with 16-byte stores.
                                        {{1001, 1028}}, {{1000, 1028}}},
                        .large_shapes = {{{4096, 4100}}, {{2048, 4096}}},
                        .small_shapes = {{{1, 1}}, {{17, 9}}, {{64, 33}}},
                        .error_scale = ErrorScale::kNormwise,
                        .tolerance = Tolerance}},
      .algorithms =
          {
              {.op = "transpose", .name = "reference", .backend = "cpu", .dtypes = all,
               .run = Reference, .is_default = true, .description = "64x64 cache tiles"},
#if OPSERVE_WITH_CUDA
              {.op = "transpose", .name = "naive", .backend = "cuda", .dtypes = all,
               .run = Naive, .min_compute_capability = kSm80,
               .description = "a thread per element"},
              {.op = "transpose", .name = "smem_tiled", .backend = "cuda", .dtypes = all,
               .run = SmemTiled, .is_default = true, .min_compute_capability = kSm80,
               .description = "32x32 tile padded by one"},
              {.op = "transpose", .name = "swizzled", .backend = "cuda", .dtypes = all,
               .run = Swizzled, .min_compute_capability = kSm80,
               .description = "32x32 tile, XOR swizzle"},
              {.op = "transpose", .name = "tma", .backend = "cuda",
               .dtypes = {D::kFloat32, D::kInt32, D::kBFloat16}, .run = Tma,
               .min_compute_capability = kSm90,
               .description = "sm_90 bulk tensor copies, 128-byte swizzle, a CTA per tile; rows "
                              "TMA cannot describe (not a 16-byte multiple) run smem_tiled, "
                              "reported as such",
               .supports = TmaDescribes, .fallback = "smem_tiled"},
#endif
          },
#if OPSERVE_WITH_CUDA
      .auto_rules = {{"transpose", "cuda", ChooseCuda}},
#endif
  };
}

}  // namespace opserve::ops
