// ResolveAlgorithm: `auto`, named algorithms, dtype refusals, and fallbacks. A row that cannot
// take a shape names another row, and the node reports that row as the algorithm that ran. The
// CUDA rows are in the table wherever the build has nvcc (CI included), so a Backend that says
// "cuda" exercises them here without a GPU: resolution never touches the device.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op.h"

namespace opserve {
namespace {

// A CUDA backend's identity without a device: enough for table lookups, nothing more.
class TableOnlyCuda final : public Backend {
 public:
  explicit TableOnlyCuda(int cc, std::string source = "table-only", int smem_per_block = 0)
      : cc_(cc), source_(source), smem_(smem_per_block) {}
  std::string name() const override { return "cuda"; }
  std::string device() const override { return "cuda:0"; }
  std::string description() const override { return "table-only"; }
  int compute_capability() const override { return cc_; }
  std::string capability_source() const override { return source_; }
  int sm_count() const override { return 132; }
  int max_shared_memory_per_block() const override { return smem_; }
  absl::StatusOr<BufferPtr> Allocate(uint64_t) override { return absl::UnimplementedError(""); }
  absl::Status CopyOut(const Buffer&, uint64_t, void*, uint64_t) override {
    return absl::UnimplementedError("");
  }
  absl::Status CopyIn(Buffer&, const void*, uint64_t) override {
    return absl::UnimplementedError("");
  }
  std::unique_ptr<Uploader> NewUploader(BufferPtr) override { return nullptr; }
  absl::StatusOr<std::unique_ptr<ExecEnv>> NewExecEnv(ExecEnv*) override {
    return absl::UnimplementedError("");
  }
  MemoryStats Memory() const override { return {}; }

 private:
  int cc_;
  std::string source_;
  int smem_;
};

// The compute capabilities of the GPUs opserve is built for (OPSERVE_CUDA_ARCHS), each with the
// shared memory a block may opt into there (CUDA C++ Programming Guide, "Technical
// Specifications per Compute Capability").
constexpr std::pair<int, int> kBuiltFor[] = {{80, 163 * 1024}, {86, 99 * 1024}, {89, 99 * 1024},
                                             {90, 227 * 1024}, {100, 227 * 1024},
                                             {120, 99 * 1024}};

bool HasCudaRows() {
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend == "cuda") return true;
  }
  return false;
}

absl::StatusOr<std::string> Resolve(const Backend& b, absl::string_view op, absl::string_view algo,
                                    std::vector<TensorMeta> in) {
  const OpSpec* spec = FindOp(op);
  if (spec == nullptr) return absl::NotFoundError("op");
  absl::StatusOr<const AlgoSpec*> a = ResolveAlgorithm(*spec, in, algo, b);
  if (!a.ok()) return a.status();
  return std::string((*a)->name);
}

TEST(Fallback, EveryFallbackNamesARowOfTheSameOpAndBackendThatTakesItsDtypes) {
  for (const AlgoSpec& a : Algorithms()) {
    if (a.supports == nullptr) {
      EXPECT_TRUE(a.fallback.empty()) << a.op << "/" << a.name << " names a fallback but no test";
      continue;
    }
    const AlgoSpec* to = nullptr;
    for (const AlgoSpec& b : Algorithms()) {
      if (b.op == a.op && b.backend == a.backend && b.name == a.fallback) to = &b;
    }
    ASSERT_NE(to, nullptr) << a.op << "/" << a.name << " falls back to unknown " << a.fallback;
    EXPECT_LE(to->min_compute_capability, a.min_compute_capability) << a.name;
    for (DType d : a.dtypes) {
      EXPECT_NE(std::find(to->dtypes.begin(), to->dtypes.end(), d), to->dtypes.end())
          << a.name << " -> " << to->name << " does not run " << DTypeName(d);
    }
  }
}

TEST(Fallback, TmaTransposeReportsSmemTiledWhereTmaCannotDescribeTheRows) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  TableOnlyCuda h100(90);
  // 37 floats = 148 bytes a row: not a 16-byte multiple.
  EXPECT_EQ(*Resolve(h100, "transpose", "tma", {{DType::kFloat32, {64, 37}}}), "smem_tiled");
  EXPECT_EQ(*Resolve(h100, "transpose", "auto", {{DType::kFloat32, {64, 37}}}), "smem_tiled");
  EXPECT_EQ(*Resolve(h100, "transpose", "tma", {{DType::kFloat32, {64, 36}}}), "tma");
  EXPECT_EQ(*Resolve(h100, "transpose", "auto", {{DType::kBFloat16, {64, 64}}}), "tma");
  // BFLOAT16 rows of 7 elements: 14 bytes.
  EXPECT_EQ(*Resolve(h100, "transpose", "tma", {{DType::kBFloat16, {64, 7}}}), "smem_tiled");
  // INT64: no TMA consumer; auto takes a row that runs it.
  EXPECT_EQ(*Resolve(h100, "transpose", "auto", {{DType::kInt64, {64, 64}}}), "smem_tiled");
  EXPECT_EQ(Resolve(h100, "transpose", "tma", {{DType::kInt64, {64, 64}}}).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(Fallback, Sm90aMatmulReportsTensorCoreOnShapesItDoesNotTake) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  TableOnlyCuda h100(90);
  auto mm = [&](int64_t m, int64_t k, int64_t n, DType d = DType::kFloat32) {
    return *Resolve(h100, "matmul", "tensor_core_sm90a", {{d, {m, k}}, {d, {k, n}}});
  };
  EXPECT_EQ(mm(2048, 512, 2048), "tensor_core_sm90a");
  EXPECT_EQ(mm(4104, 1032, 4112, DType::kBFloat16), "tensor_core_sm90a");
  EXPECT_EQ(mm(64, 64, 64), "tensor_core");          // K < 256 and few tiles
  EXPECT_EQ(mm(4096, 1023, 4096), "tensor_core");    // rows of A not a 16-byte multiple
  EXPECT_EQ(mm(4096, 1024, 4097), "tensor_core");    // rows of B not a 16-byte multiple
  // tensor_core itself never turns into the sm90a kernel.
  EXPECT_EQ(*Resolve(h100, "matmul", "tensor_core", {{DType::kFloat32, {2048, 512}},
                                                     {DType::kFloat32, {512, 2048}}}),
            "tensor_core");
}

TEST(Fallback, Sm90aRowsAreNotOfferedOnNewerArchitectures) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  TableOnlyCuda blackwell(100);
  const std::vector<TensorMeta> in = {{DType::kFloat32, {2048, 512}}, {DType::kFloat32, {512, 2048}}};
  EXPECT_EQ(Resolve(blackwell, "matmul", "tensor_core_sm90a", in).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(*Resolve(blackwell, "matmul", "tensor_core", in), "tensor_core");
  EXPECT_EQ(*Resolve(blackwell, "transpose", "tma", {{DType::kFloat32, {64, 64}}}), "tma");
}

TEST(Fallback, HopperRowsAreNotOfferedBelowSm90) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  TableOnlyCuda a100(80);
  EXPECT_EQ(*Resolve(a100, "transpose", "auto", {{DType::kFloat32, {64, 64}}}), "smem_tiled");
  EXPECT_EQ(Resolve(a100, "transpose", "tma", {{DType::kFloat32, {64, 64}}}).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Every CUDA row states the capability it needs, at least the oldest the kernels are built for:
// a row left at 0 ("any") would be offered on a GPU the kernels have no code for.
TEST(Table, EveryCudaRowStatesTheCapabilityItNeeds) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  for (const AlgoSpec& a : Algorithms()) {
    SCOPED_TRACE(absl::StrCat(a.op, "/", a.name, " (", a.backend, ")"));
    if (a.backend == "cpu") {
      EXPECT_EQ(a.min_compute_capability, 0);
      EXPECT_EQ(a.max_compute_capability, 0);
      continue;
    }
    EXPECT_GE(a.min_compute_capability, kMinCudaComputeCapability);
    EXPECT_TRUE(a.max_compute_capability == 0 || a.max_compute_capability >= a.min_compute_capability);
  }
}

// The Hopper rows need 9.0, and everything else runs from 8.0: on an A100 every op keeps its
// default row and every dtype it has on a Hopper.
TEST(Table, OnlyTheHopperRowsNeedMoreThanSm80) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  std::set<std::string> above;
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend == "cuda" && a.min_compute_capability > kSm80) {
      above.insert(absl::StrCat(a.op, "/", a.name));
      EXPECT_EQ(a.min_compute_capability, kSm90) << a.op << "/" << a.name;
    }
  }
  EXPECT_EQ(above, (std::set<std::string>{"matmul/tensor_core_sm90a", "transpose/tma"}));
  TableOnlyCuda a100(80), h100(90);
  for (const OpSpec& op : Ops()) {
    EXPECT_EQ(DTypesFor(op.name, a100), DTypesFor(op.name, h100)) << op.name;
  }
}

// `auto` chooses among the rows the device runs, on every GPU the kernels are built for: a
// chooser's pick is a row of that device (never one resolution would have to drop), for every
// shape of the op's test model and every dtype.
TEST(Table, AutoChoosesOnlyRowsTheDeviceRuns) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  for (const auto& [cc, smem] : kBuiltFor) {
    TableOnlyCuda device(cc, "table-only", smem);
    for (const AutoRule& rule : AutoRules()) {
      if (rule.backend != "cuda") continue;
      const OpSpec* op = FindOp(rule.op);
      ASSERT_NE(op, nullptr) << rule.op;
      std::vector<std::vector<std::vector<int64_t>>> shapes = op->test.edge_shapes;
      shapes.insert(shapes.end(), op->test.large_shapes.begin(), op->test.large_shapes.end());
      for (DType d : DTypesFor(op->name, device)) {
        for (const auto& s : shapes) {
          std::vector<TensorMeta> in;
          for (const auto& dims : s) in.push_back({d, dims});
          const absl::string_view pick = rule.choose(in, device);
          EXPECT_NE(FindAlgorithm(op->name, pick, device), nullptr)
              << op->name << " auto picks " << pick << " on " << cc;
          absl::StatusOr<const AlgoSpec*> resolved = ResolveAlgorithm(*op, in, "auto", device);
          ASSERT_TRUE(resolved.ok()) << resolved.status();
          EXPECT_NE(FindAlgorithm(op->name, (*resolved)->name, device), nullptr);
        }
      }
    }
  }
}

// Naming a row the device cannot run answers UNIMPLEMENTED with the capability the row needs and
// the device's, and the rows it does run.
TEST(Resolve, NamingARowAboveTheDeviceNamesBothCapabilities) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  TableOnlyCuda capped(80, "NVIDIA H100 80GB HBM3, 9.0 capped by --max_compute_capability");
  absl::Status s = Resolve(capped, "transpose", "tma", {{DType::kFloat32, {64, 64}}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(),
            "transpose algorithm 'tma' needs compute capability 9.0; this device (NVIDIA H100 "
            "80GB HBM3, 9.0 capped by --max_compute_capability) is 8.0; it runs: naive, "
            "smem_tiled, swizzled, auto");
  TableOnlyCuda b200(100, "NVIDIA B200");
  s = Resolve(b200, "matmul", "tensor_core_sm90a",
              {{DType::kFloat32, {2048, 512}}, {DType::kFloat32, {512, 2048}}})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("matmul algorithm 'tensor_core_sm90a' runs on compute capability "
                             "9.0 only; this device (NVIDIA B200) is 10.0"),
            absl::string_view::npos)
      << s;
  // A name that is no row of the op at all is the request's mistake.
  s = Resolve(capped, "transpose", "nope", {{DType::kFloat32, {64, 64}}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("has no algorithm 'nope'"), absl::string_view::npos) << s;
}

// A row whose blocks need more shared memory than a device gives one (tensor_core's 105 KiB
// ring against the 99 KiB of 8.6, 8.9 and 12.0) is not offered there, and naming it says why.
TEST(Resolve, RowsNeedingMoreSharedMemoryThanTheDeviceGivesAreNotOffered) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  const std::vector<TensorMeta> in = {{DType::kFloat32, {256, 256}}, {DType::kFloat32, {256, 256}}};
  for (const auto& [cc, smem] : kBuiltFor) {
    TableOnlyCuda device(cc, "table-only", smem);
    const AlgoSpec* row = nullptr;
    for (const AlgoSpec& a : Algorithms()) {
      if (a.op == "matmul" && a.name == "tensor_core" && a.backend == "cuda") row = &a;
    }
    ASSERT_NE(row, nullptr);
    ASSERT_GT(row->min_shared_memory_per_block, 99 * 1024) << "the ring fits every device now";
    const bool fits = row->min_shared_memory_per_block <= smem;
    EXPECT_EQ(FindAlgorithm("matmul", "tensor_core", device) != nullptr, fits) << cc;
    absl::StatusOr<std::string> got = Resolve(device, "matmul", "tensor_core", in);
    if (fits) {
      EXPECT_TRUE(got.ok()) << cc << ": " << got.status();
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented) << cc;
      EXPECT_NE(got.status().message().find(absl::StrCat(
                    "matmul algorithm 'tensor_core' needs ", row->min_shared_memory_per_block,
                    " bytes of shared memory per block; this device (table-only) allows ", smem)),
                absl::string_view::npos)
          << got.status();
    }
  }
}

TEST(ComputeCapability, ParsesMajorDotMinor) {
  EXPECT_EQ(*ParseComputeCapability("8.0"), 80);
  EXPECT_EQ(*ParseComputeCapability("8.6"), 86);
  EXPECT_EQ(*ParseComputeCapability("12.0"), 120);
  EXPECT_EQ(ComputeCapabilityName(80), "8.0");
  EXPECT_EQ(ComputeCapabilityName(120), "12.0");
  for (const char* bad : {"", "8", "80", "8.", ".0", "8.00", "abc", "-8.0", "123.0", "8.0x",
                          " 8.0", "8,0"}) {
    EXPECT_EQ(ParseComputeCapability(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << bad << "'";
  }
}

// The reductions' fast families run every dtype on CUDA; `auto` picks one that does.
TEST(Resolve, AutoReductionsRunEveryDtypeOnCuda) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  TableOnlyCuda h100(90);
  for (DType d : {DType::kFloat32, DType::kInt32, DType::kInt64, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(d));
    for (const char* op : {"sum", "max", "min"}) {
      for (int64_t n : {int64_t{1000}, int64_t{1} << 22, int64_t{1} << 28}) {
        EXPECT_TRUE(Resolve(h100, op, "auto", {{d, {n}}}).ok()) << op << " " << n;
      }
      EXPECT_TRUE(Resolve(h100, op, "cub", {{d, {1000}}}).ok()) << op;
    }
    for (auto shape : {std::vector<int64_t>{10, 2048}, {1 << 20, 64}, {8192, 8192}, {4096, 4096}}) {
      for (const char* op : {"row_sum", "row_mean", "row_max", "row_min"}) {
        EXPECT_TRUE(Resolve(h100, op, "auto", {{d, shape}}).ok()) << op;
        // cub_segmented does not offer bf16 extrema (server/ops/reduce_family.h says why).
        const absl::string_view name = op;
        const bool bf16_extremum =
            d == DType::kBFloat16 && (name == "row_max" || name == "row_min");
        EXPECT_EQ(Resolve(h100, op, "cub_segmented", {{d, shape}}).ok(), !bf16_extremum) << op;
      }
    }
  }
}

// A context with no device behind it: scratch is refused, so a launcher that gets past its size
// query stops there instead of launching.
class NoDeviceEnv final : public ExecEnv {
 public:
  absl::StatusOr<BufferPtr> Allocate(uint64_t) override { return absl::UnavailableError("none"); }
  absl::Status CopyIn(Buffer&, const void*, uint64_t) override { return absl::OkStatus(); }
  absl::Status Fill(Buffer&, uint8_t, uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<void*> Scratch(uint64_t) override {
    return absl::FailedPreconditionError("no device memory in this test");
  }
  void MarkStart(int) override {}
  void MarkEnd(int) override {}
  absl::StatusOr<std::vector<double>> Finish(int n) override { return std::vector<double>(n); }
};

// Every dtype a cuda reduction row lists has a launcher overload behind it: the adapter answers
// UNIMPLEMENTED, before any device call, only where the kernel file has none.
TEST(Launchers, EveryListedReductionDtypeHasALauncherOverload) {
  if (!HasCudaRows()) GTEST_SKIP() << "built without CUDA: the table has no cuda rows";
  NoDeviceEnv env;
  alignas(256) static char dummy_in[256], dummy_out[256];
  int checked = 0;
  for (const AlgoSpec& a : Algorithms()) {
    const bool whole = a.op == "sum" || a.op == "max" || a.op == "min";
    const bool rows = a.op == "row_sum" || a.op == "row_mean" || a.op == "row_max" ||
                      a.op == "row_min";
    if (a.backend != "cuda" || !(whole || rows)) continue;
    const OpSpec* op = FindOp(a.op);
    for (DType d : {DType::kFloat32, DType::kInt32, DType::kInt64, DType::kBFloat16}) {
      const std::vector<TensorMeta> in = {
          {d, whole ? std::vector<int64_t>{64} : std::vector<int64_t>{4, 16}}};
      absl::StatusOr<TensorMeta> out = op->infer(in);
      ASSERT_TRUE(out.ok()) << out.status();
      const void* ptrs[] = {dummy_in};
      const AttrMap attrs;
      KernelArgs args{ptrs, in, dummy_out, *out, attrs, env};
      const absl::Status s = a.run(args);
      const bool listed = std::find(a.dtypes.begin(), a.dtypes.end(), d) != a.dtypes.end();
      SCOPED_TRACE(absl::StrCat(a.op, "/", a.name, " ", DTypeName(d), ": ", s.ToString()));
      if (listed) {
        EXPECT_NE(s.code(), absl::StatusCode::kUnimplemented) << "listed, but no launcher";
        ++checked;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << "unlisted, yet not refused";
      }
    }
  }
  EXPECT_GT(checked, 60);
}

}  // namespace
}  // namespace opserve
