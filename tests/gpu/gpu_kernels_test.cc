// The GPU suite: every "cuda" row of the op table, for every dtype it accepts, over the op's
// edge and large shapes, against the CPU reference row of the same op. Rows, shapes, error
// measure and tolerance are all read from the table, so a new op or algorithm is tested without
// editing this file.
//
// Inputs are fresh random values every run (never zeros; the seed is printed). Outputs are
// poisoned (0xFF bytes: NaN for floats) and fenced by guard bytes, so an unwritten element or an
// out-of-bounds write fails. The error is measured by tests/support/result_check.h, against the
// op's tolerance for the algorithm and dtype; NaN never passes. The exact reductions (max, min,
// row_max, row_min) are also run with NaNs in their inputs (GpuNaNTest).
// Without a usable GPU every test is reported as skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/cuda_backend.h"
#include "server/ops/op.h"
#include "server/ops/op_util.h"
#include "tests/gpu/suite_device.h"
#include "tests/support/result_check.h"

namespace opserve {
namespace {

constexpr uint64_t kGuardBytes = 256;  // keeps the output 256-byte aligned, as the pool does
constexpr uint8_t kPoison = 0xFF;
constexpr uint8_t kGuard = 0xA5;

using Shapes = std::vector<std::vector<int64_t>>;  // one shape per input

struct Case {
  const AlgoSpec* algo;
  DType dtype;
  Shapes shapes;
  std::string name;
  bool large = false;  // one of the op's large shapes
};

// ctest lists parameters by name, not as bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend != "cuda") continue;
    const TestModel& model = FindOp(a.op)->test;
    std::vector<Shapes> all = model.edge_shapes;
    all.insert(all.end(), model.large_shapes.begin(), model.large_shapes.end());
    for (DType d : a.dtypes) {
      for (size_t k = 0; k < all.size(); ++k) {
        const Shapes& s = all[k];
        std::string name = std::string(a.op) + "_" + std::string(a.name) + "_" +
                           std::string(DTypeName(d));
        for (const auto& in : s) {
          name += "_";
          for (size_t i = 0; i < in.size(); ++i) name += (i ? "x" : "") + std::to_string(in[i]);
        }
        cases.push_back({&a, d, s, name, k >= model.edge_shapes.size()});
      }
    }
  }
  return cases;
}

uint64_t Seed() {
  static const uint64_t seed = [] {
    const uint64_t s = std::random_device{}() * 0x9E3779B97F4A7C15ull + std::random_device{}();
    std::printf("gpu suite: random seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// Random values of the dtype: floats in [-1, 1) (no zeros), ints in [-1000, 1000] plus
// occasional values near the int32 limits so that int32 accumulation would overflow.
std::string RandomBytes(const TensorMeta& meta, uint64_t salt) {
  std::mt19937_64 rng(Seed() ^ (salt * 0xD1B54A32D192ED03ull));
  const int64_t n = meta.NumElements();
  std::string bytes(meta.Bytes(), '\0');
  std::uniform_real_distribution<float> uf(-1.f, 1.f);
  switch (meta.dtype) {
    case DType::kFloat32: {
      auto* p = reinterpret_cast<float*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) {
        float v = uf(rng);
        p[i] = v == 0.f ? 0.5f : v;
      }
      break;
    }
    case DType::kBFloat16: {
      auto* p = reinterpret_cast<uint16_t*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = op_util::FloatToBf16(uf(rng) + 2e-3f);
      break;
    }
    case DType::kInt32: {
      auto* p = reinterpret_cast<int32_t*>(bytes.data());
      std::uniform_int_distribution<int32_t> ui(-1000, 1000);
      for (int64_t i = 0; i < n; ++i) p[i] = (i % 4099 == 7) ? 2147483000 - static_cast<int32_t>(i % 13) : ui(rng);
      break;
    }
    case DType::kInt64: {
      auto* p = reinterpret_cast<int64_t*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(rng());
      break;
    }
    default:
      break;
  }
  return bytes;
}

// The suites' shared state: GPU 0's backend at the suite's cap and an execution context on it,
// and the CPU backend the references run on; all null without a usable GPU.
class GpuSuite : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (backend_ != nullptr || !ProbeCuda(gpu_suite::SuiteOrdinal()).ok()) return;
    // At the suite's cap, if any: the rows above it are skipped as on a GPU of that capability.
    auto b = MakeCudaBackend(gpu_suite::SuiteOrdinal(), 0, gpu_suite::SuiteCap());
    if (!b.ok()) return;
    backend_ = b->release();
    env_ = backend_->NewExecEnv()->release();
    cpu_ = MakeCpuBackend(0).release();
    cpu_env_ = cpu_->NewExecEnv()->release();
  }

  static Backend* backend_;
  static ExecEnv* env_;
  static Backend* cpu_;
  static ExecEnv* cpu_env_;
};
Backend* GpuSuite::backend_ = nullptr;
ExecEnv* GpuSuite::env_ = nullptr;
Backend* GpuSuite::cpu_ = nullptr;
ExecEnv* GpuSuite::cpu_env_ = nullptr;

class GpuKernelTest : public GpuSuite, public testing::WithParamInterface<Case> {};

// Writes the dtype's highest (or lowest) value over element `index` of `bytes`: +-infinity for
// the floats, the integer limits for the integers.
void PlantExtreme(DType dtype, bool highest, int64_t index, std::string* bytes) {
  switch (dtype) {
    case DType::kFloat32: {
      const float v = highest ? INFINITY : -INFINITY;
      std::memcpy(bytes->data() + index * 4, &v, 4);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t v = highest ? 0x7F80u : 0xFF80u;
      std::memcpy(bytes->data() + index * 2, &v, 2);
      break;
    }
    case DType::kInt32: {
      const int32_t v = highest ? INT32_MAX : INT32_MIN;
      std::memcpy(bytes->data() + index * 4, &v, 4);
      break;
    }
    case DType::kInt64: {
      const int64_t v = highest ? INT64_MAX : INT64_MIN;
      std::memcpy(bytes->data() + index * 8, &v, 8);
      break;
    }
    default:
      ADD_FAILURE() << "PlantExtreme: unexpected dtype";
  }
}

// Runs `algo` on the GPU over `host` inputs (one byte string per input of `metas`) into a
// poisoned, guarded output, and the CPU reference row of the same op over the same bytes.
// The GPU's output bytes go to *got and the reference's to *ref; *refused says the row does not
// take this shape (validation sends such nodes to its fallback) and then refused it, as it must.
void RunBoth(Backend& backend, ExecEnv& env, ExecEnv& cpu_env, const AlgoSpec& algo,
             const std::vector<TensorMeta>& metas, const std::vector<std::string>& host,
             std::string* got, std::string* ref, bool* refused) {
  const OpSpec* op = FindOp(algo.op);
  ASSERT_NE(op, nullptr);
  std::vector<BufferPtr> dev;
  std::vector<const void*> dev_ptrs, host_ptrs;
  for (size_t i = 0; i < metas.size(); ++i) {
    auto b = env.Allocate(metas[i].Bytes());
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(env.CopyIn(**b, host[i].data(), host[i].size()).ok());
    dev.push_back(*b);
    dev_ptrs.push_back((*b)->data());
    host_ptrs.push_back(host[i].data());
  }
  auto out_meta = op->infer(metas);
  ASSERT_TRUE(out_meta.ok()) << out_meta.status();
  const uint64_t out_bytes = out_meta->Bytes();
  // A row that does not take this shape must refuse it, not run another kernel in its place:
  // validation sends such nodes to the row's fallback, which the response then reports.
  *refused = algo.supports != nullptr && !algo.supports(metas);

  // Poisoned output between guard bands.
  auto out = env.Allocate(out_bytes + 2 * kGuardBytes);
  ASSERT_TRUE(out.ok()) << out.status();
  auto stream = static_cast<cudaStream_t>(env.stream());
  char* d_out = static_cast<char*>((*out)->data());
  ASSERT_EQ(cudaMemsetAsync(d_out, kGuard, kGuardBytes, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d_out + kGuardBytes, kPoison, out_bytes, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d_out + kGuardBytes + out_bytes, kGuard, kGuardBytes, stream),
            cudaSuccess);

  AttrMap attrs;
  KernelArgs args{dev_ptrs, metas, d_out + kGuardBytes, *out_meta, attrs, env};
  env.MarkStart(0);
  absl::Status run = algo.run(args);
  env.MarkEnd(0);
  auto done = env.Finish(1);
  if (*refused) {
    EXPECT_FALSE(run.ok()) << algo.name << " ran a shape it says it does not take";
    ASSERT_TRUE(done.ok()) << done.status();
    return;
  }
  ASSERT_TRUE(run.ok()) << run;
  ASSERT_TRUE(done.ok()) << done.status();
  std::string all(out_bytes + 2 * kGuardBytes, '\0');
  ASSERT_TRUE(backend.CopyOut(**out, 0, all.data(), all.size()).ok());
  for (uint64_t i = 0; i < kGuardBytes; ++i) {
    ASSERT_EQ(static_cast<uint8_t>(all[i]), kGuard)
        << "write before the output at byte -" << (kGuardBytes - i);
    ASSERT_EQ(static_cast<uint8_t>(all[kGuardBytes + out_bytes + i]), kGuard)
        << "write past the output at byte +" << i;
  }
  *got = all.substr(kGuardBytes, out_bytes);

  // The CPU reference row of the same op.
  ref->assign(out_bytes, '\0');
  KernelArgs ref_args{host_ptrs, metas, ref->data(), *out_meta, attrs, cpu_env};
  ASSERT_TRUE(CpuReference(algo.op)->run(ref_args).ok());
  (void)cpu_env.Finish(0);
}

TEST_P(GpuKernelTest, MatchesCpuReference) {
  const Case& c = GetParam();
  if (backend_ == nullptr) GTEST_SKIP() << "no usable GPU: " << ProbeCuda(gpu_suite::SuiteOrdinal()).message();
  if (FindAlgorithm(c.algo->op, c.algo->name, *backend_) == nullptr) {
    GTEST_SKIP() << c.algo->name << " does not run at compute capability "
                 << ComputeCapabilityName(backend_->compute_capability()) << " ("
                 << backend_->capability_source() << ")";
  }
  const OpSpec* op = FindOp(c.algo->op);
  ASSERT_NE(op, nullptr);
  std::vector<TensorMeta> metas;
  std::vector<std::string> host;
  std::vector<const void*> host_ptrs;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    metas.push_back({c.dtype, c.shapes[i]});
    host.push_back(RandomBytes(metas.back(), i + 1));
  }
  for (const std::string& h : host) host_ptrs.push_back(h.data());
  std::string got, ref;
  bool refused = false;
  RunBoth(*backend_, *env_, *cpu_env_, *c.algo, metas, host, &got, &ref, &refused);
  if (HasFatalFailure() || refused) return;

  const TensorMeta out_meta = *op->infer(metas);
  absl::StatusOr<double> err = RelativeError({.op = *op,
                                              .input_meta = metas,
                                              .inputs = host_ptrs,
                                              .output_meta = out_meta,
                                              .got = got.data(),
                                              .reference = ref.data()});
  ASSERT_TRUE(err.ok()) << err.status().message();
  const double tol = op->test.tolerance(c.algo->name, c.dtype);
  EXPECT_TRUE(*err <= tol) << "relative error " << *err << " over " << tol;
  RecordProperty("relative_error", std::to_string(*err));

  // The exact reductions (max, min...) on random inputs can miss a dropped element: another one
  // is as large. So on the edge shapes the type's highest and lowest value are planted in turn at
  // the first, a middle and the last element (for rows: of the first, a middle and the last row),
  // and the output must still be the reference's, bit for bit.
  if (op->test.error_scale != ErrorScale::kExact || c.large || op->arity != 1) return;
  const int64_t n = metas[0].NumElements();
  for (const bool highest : {true, false}) {
    for (const int64_t index : {int64_t{0}, n / 2, n - 1}) {
      SCOPED_TRACE(absl::StrCat(highest ? "highest" : "lowest", " value at element ", index));
      std::vector<std::string> planted = host;
      PlantExtreme(c.dtype, highest, index, &planted[0]);
      std::string pgot, pref;
      RunBoth(*backend_, *env_, *cpu_env_, *c.algo, metas, planted, &pgot, &pref, &refused);
      if (HasFatalFailure()) return;
      EXPECT_EQ(pgot, pref) << "differs from the CPU reference";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, GpuKernelTest, testing::ValuesIn(AllCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuKernelTest);

// NaN propagation of the exact reductions (the ops whose error scale is kExact: max, min,
// row_max, row_min), on the GPU: every cuda row, FLOAT32 and BFLOAT16, each edge shape, with one
// NaN at the first, a middle and the last element of the input in turn (for the row ops: the
// first element of the first row, the middle of a middle row, the last element of the last row),
// each NaN a different bit pattern. The output must equal the CPU reference's bit for bit: the
// canonical NaN where a NaN was reduced, and the exact extremum elsewhere.
struct NaNCase {
  const AlgoSpec* algo;
  DType dtype;
  std::vector<int64_t> shape;
  std::string name;
};
void PrintTo(const NaNCase& c, std::ostream* os) { *os << c.name; }

std::vector<NaNCase> NaNCases() {
  std::vector<NaNCase> cases;
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend != "cuda") continue;
    const OpSpec* op = FindOp(a.op);
    if (op->test.error_scale != ErrorScale::kExact || op->arity != 1) continue;
    for (DType d : a.dtypes) {
      if (d != DType::kFloat32 && d != DType::kBFloat16) continue;
      for (const Shapes& s : op->test.edge_shapes) {
        cases.push_back({&a, d, s[0],
                         absl::StrCat(a.op, "_", a.name, "_", DTypeName(d), "_",
                                      absl::StrJoin(s[0], "x"))});
      }
    }
  }
  return cases;
}

class GpuNaNTest : public GpuSuite, public testing::WithParamInterface<NaNCase> {};

TEST_P(GpuNaNTest, PropagatesAsTheReference) {
  const NaNCase& c = GetParam();
  if (backend_ == nullptr) GTEST_SKIP() << "no usable GPU: " << ProbeCuda(gpu_suite::SuiteOrdinal()).message();
  if (FindAlgorithm(c.algo->op, c.algo->name, *backend_) == nullptr) {
    GTEST_SKIP() << c.algo->name << " does not run at compute capability "
                 << ComputeCapabilityName(backend_->compute_capability());
  }
  const std::vector<TensorMeta> metas = {{c.dtype, c.shape}};
  const TensorMeta out_meta = *FindOp(c.algo->op)->infer(metas);
  const int64_t n = metas[0].NumElements(), outputs = out_meta.NumElements();
  const size_t es = ElementSize(c.dtype);
  const uint32_t canonical = c.dtype == DType::kFloat32 ? 0x7FFFFFFFu : 0x7FFFu;
  // Quiet, negative and payload-carrying NaNs: none of them is the canonical NaN the output
  // must hold, nor the poison.
  constexpr uint32_t kF32NaNs[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u};
  constexpr uint16_t kBf16NaNs[] = {0x7FC0u, 0xFFC1u, 0x7F81u};
  const char* const kWhere[] = {"first", "middle", "last"};
  for (int at = 0; at < 3; ++at) {
    SCOPED_TRACE(absl::StrCat("NaN at the ", kWhere[at], " element"));
    std::vector<std::string> host = {RandomBytes(metas[0], 1 + at)};
    const int64_t index = at == 0 ? 0 : at == 1 ? n / 2 : n - 1;
    if (c.dtype == DType::kFloat32) {
      std::memcpy(host[0].data() + index * 4, &kF32NaNs[at], 4);
    } else {
      std::memcpy(host[0].data() + index * 2, &kBf16NaNs[at], 2);
    }
    std::string got, ref;
    bool refused = false;
    RunBoth(*backend_, *env_, *cpu_env_, *c.algo, metas, host, &got, &ref, &refused);
    if (HasFatalFailure() || refused) return;

    // The reference itself must have propagated it, or the comparison proves nothing.
    const int64_t nan_output = outputs == 1 ? 0 : index / (n / outputs);
    uint32_t ref_bits = 0, got_bits = 0;
    std::memcpy(&ref_bits, ref.data() + nan_output * es, es);
    std::memcpy(&got_bits, got.data() + nan_output * es, es);
    ASSERT_EQ(ref_bits, canonical) << "the CPU reference did not give the canonical NaN";
    EXPECT_EQ(got_bits, canonical) << "output " << nan_output << ": bits 0x" << std::hex
                                   << got_bits;
    for (int64_t i = 0; i < outputs; ++i) {
      EXPECT_EQ(std::memcmp(got.data() + i * es, ref.data() + i * es, es), 0)
          << "output " << i << " differs from the CPU reference";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, GpuNaNTest, testing::ValuesIn(NaNCases()),
                         [](const testing::TestParamInfo<NaNCase>& info) {
                           return info.param.name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuNaNTest);

// FLOAT32 sum: every algorithm the table calls deterministic, and what auto resolves to, must give
// the same bits for the same input, run after run (a float sum's bits depend on its order).
TEST(GpuDeterminism, Float32SumsAreBitwiseRepeatable) {
  if (!ProbeCuda(gpu_suite::SuiteOrdinal()).ok()) GTEST_SKIP() << "no usable GPU: " << ProbeCuda(gpu_suite::SuiteOrdinal()).message();
  auto backend = MakeCudaBackend(gpu_suite::SuiteOrdinal(), 0, gpu_suite::SuiteCap());
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto env = (*backend)->NewExecEnv();
  ASSERT_TRUE(env.ok());
  const OpSpec* op = FindOp("sum");
  ASSERT_NE(op, nullptr);
  for (int64_t n : {int64_t{1000003}, (int64_t{1} << 25) + 17}) {
    TensorMeta meta{DType::kFloat32, {n}};
    std::vector<TensorMeta> metas{meta};
    auto resolved = ResolveAlgorithm(*op, metas, "auto", **backend);
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_TRUE((*resolved)->deterministic) << "auto -> " << (*resolved)->name << " at n = " << n;
    const std::string host = RandomBytes(meta, 99);
    auto in = (*env)->Allocate(meta.Bytes());
    ASSERT_TRUE(in.ok());
    ASSERT_TRUE((*env)->CopyIn(**in, host.data(), host.size()).ok());
    TensorMeta out_meta{DType::kFloat32, {}};
    AttrMap attrs;
    int checked = 0;
    for (const AlgoSpec* algo : AlgorithmsFor("sum", **backend)) {
      if (!algo->deterministic) continue;
      ++checked;
      uint32_t first = 0;
      for (int rep = 0; rep < 10; ++rep) {
        auto out = (*env)->Allocate(4);
        ASSERT_TRUE(out.ok());
        // Poisoned (a NaN pattern), so a run that writes nothing cannot repeat the last bits.
        ASSERT_EQ(cudaMemset((*out)->data(), 0xFF, 4), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the env's stream does not wait for it
        const void* ptrs[] = {(*in)->data()};
        KernelArgs args{ptrs, metas, (*out)->data(), out_meta, attrs, **env};
        ASSERT_TRUE(algo->run(args).ok()) << algo->name;
        ASSERT_TRUE((*env)->Finish(0).ok()) << algo->name;
        uint32_t bits = 0;
        ASSERT_TRUE((*backend)->CopyOut(**out, 0, &bits, 4).ok());
        ASSERT_NE(bits, 0xFFFFFFFFu) << algo->name << " wrote nothing";
        if (rep == 0) first = bits;
        ASSERT_EQ(bits, first) << "run " << rep << " of " << algo->name << " at n = " << n
                               << " gave different bits";
      }
    }
    EXPECT_GE(checked, 2) << "the table lists fewer deterministic sums than expected";
  }
}

// Inside a CUDA graph an execution context times its nodes with device timestamps and copies
// small outputs to the host with a kernel (server/engine/cuda_node_timer.h), which also writes
// the stamp of the boundary before it. Captured once and replayed, the copy must land in host
// memory poisoned before each launch, a node's time must be the device's, and a node with
// nothing queued between its marks must read exactly 0. Without a copy the graph's last stamp
// is a timestamp kernel of its own; a stamp nothing wrote would read as 0 (or the last
// request's time, before this one's start). In the GPU suite's sanitizer runs too
// (scripts/gpu-suite.sh).
TEST(GpuGraphMarks, ReplaysCopyWithAKernelAndTimeWithTimestamps) {
  if (!ProbeCuda(gpu_suite::SuiteOrdinal()).ok()) GTEST_SKIP() << "no usable GPU: " << ProbeCuda(gpu_suite::SuiteOrdinal()).message();
  auto backend = MakeCudaBackend(gpu_suite::SuiteOrdinal(), 0, gpu_suite::SuiteCap(), /*graph_cache=*/4);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto env = (*backend)->NewExecEnv();
  ASSERT_TRUE(env.ok()) << env.status();
  ExecEnv& e = **env;
  constexpr uint64_t kBytes = 4001;  // 250 16-byte words and one byte more
  auto src = e.Allocate(kBytes);
  ASSERT_TRUE(src.ok()) << src.status();
  for (bool copy : {true, false}) {
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE(std::string(copy ? "with" : "without") + " a copy, request " +
                   std::to_string(rep));
      e.BeginRequest(2);
      auto staged = e.ReserveStaging(kBytes);
      ASSERT_TRUE(staged.ok()) << staged.status();
      ASSERT_NE(*staged, nullptr);
      std::memset(*staged, 0, kBytes);  // nothing of the context is on the device now
      const void* bindings[] = {(*src)->data(), *staged};
      auto replay = e.LaunchAsGraph(copy ? "marks" : "marks, no copy", bindings,
                                    [&]() -> absl::Status {
        e.MarkStart(0);
        absl::Status filled = e.Fill(**src, 0x5A, kBytes);
        e.MarkEnd(0);
        if (!filled.ok()) return filled;
        e.MarkStart(1);  // nothing queued for node 1: it shares node 0's closing stamp
        e.MarkEnd(1);
        return copy ? e.CopyToStaging(**src, *staged, kBytes) : absl::OkStatus();
      });
      ASSERT_TRUE(replay.ok()) << replay.status();
      EXPECT_EQ(*replay, rep == 0 ? GraphReplay::kCaptured : GraphReplay::kReplayed);
      ASSERT_TRUE(e.Launched().ok());
      auto seconds = e.Finish(2);
      ASSERT_TRUE(seconds.ok()) << seconds.status();
      ASSERT_EQ(seconds->size(), 2u);
      EXPECT_GT((*seconds)[0], 0.0);
      EXPECT_LT((*seconds)[0], 0.1);
      EXPECT_EQ((*seconds)[1], 0.0);
      if (!copy) continue;
      const auto* bytes = static_cast<const unsigned char*>(*staged);
      int64_t wrong = 0;
      for (uint64_t i = 0; i < kBytes; ++i) wrong += bytes[i] != 0x5A;
      EXPECT_EQ(wrong, 0) << "bytes the copy did not bring to the host";
    }
  }
}

}  // namespace
}  // namespace opserve
