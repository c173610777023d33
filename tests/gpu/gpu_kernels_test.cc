// The GPU suite: every "cuda" row of the op table, for every dtype it accepts, over edge shapes,
// against the CPU reference row of the same op. Rows are read from the table, so a new
// algorithm is tested without editing this file.
//
// Inputs are fresh random values every run (never zeros; the seed is printed). Outputs are
// poisoned (0xFF bytes: NaN for floats) and fenced by guard bytes, so an unwritten element or an
// out-of-bounds write fails. Tolerances are set by precision; NaN never passes.
// Without a usable GPU every test is reported as skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op_util.h"
#include "server/engine/cuda_backend.h"
#include "server/ops/op.h"

namespace opserve {
namespace {

constexpr uint64_t kGuardBytes = 256;  // keeps the output 256-byte aligned, as the pool does
constexpr uint8_t kPoison = 0xFF;
constexpr uint8_t kGuard = 0xA5;

struct Shape {
  std::vector<std::vector<int64_t>> inputs;
};

// Edge sizes per op: 1, one past a tile, primes, not multiples of 32, and large.
std::vector<Shape> ShapesFor(absl::string_view op) {
  if (op == "sum") {
    return {{{{1}}}, {{{2}}}, {{{31}}}, {{{33}}}, {{{1025}}}, {{{65537}}}, {{{3, 5, 7, 11}}},
            {{{1000003}}}, {{{(1 << 24) + 3}}},
            // Over 1 GiB of FLOAT32/INT32: 2^28 + 1001 elements.
            {{{(1 << 28) + 1001}}}};
  }
  if (op == "row_sum" || op == "row_mean") {
    return {{{{1, 1}}},      {{{1, 33}}},        {{{7, 1}}},          {{{10, 2048}}},
            {{{33, 127}}},   {{{1000, 129}}},    {{{4097, 65}}},      {{{1, 1048577}}},
            {{{3, 1000003}}}, {{{20000, 64}}},   {{{131, 4099}}},     {{{17, 65537}}},
            // Many rows of >= 8192 floats (block_per_row's 512-thread blocks), odd length so
            // rows after the first start misaligned.
            {{{300, 8195}}}};
  }
  if (op == "transpose") {
    return {{{{1, 1}}},    {{{1, 37}}},     {{{37, 1}}},    {{{31, 33}}},    {{{33, 31}}},
            {{{64, 64}}},  {{{65, 129}}},   {{{128, 96}}},  {{{1000, 1001}}}, {{{3000, 7}}},
            {{{4096, 4100}}}, {{{2048, 4096}}},
            // TMA input walked column-major with a partial last tile in both directions: with
            // element stores (rows * 4 % 16 != 0), and with 16-byte stores.
            {{{1001, 1028}}}, {{{1000, 1028}}}};
  }
  if (op == "matmul") {
    return {{{{1, 1}, {1, 1}}},       {{{1, 17}, {17, 1}}},       {{{17, 1}, {1, 33}}},
            {{{33, 65}, {65, 17}}},   {{{64, 64}, {64, 64}}},     {{{127, 129}, {129, 131}}},
            {{{256, 256}, {256, 256}}}, {{{128, 520}, {520, 136}}}, {{{1000, 513}, {513, 1001}}},
            {{{4095, 1023}, {1023, 4097}}},
            // Large enough, and aligned, for the sm_90a wgmma path: its edge tiles included.
            {{{2048, 512}, {512, 2048}}}, {{{4104, 1032}, {1032, 4112}}}};
  }
  return {};
}

struct Case {
  const AlgoSpec* algo;
  DType dtype;
  Shape shape;
  std::string name;
};

// ctest lists parameters by name, not as bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend != "cuda") continue;
    for (DType d : a.dtypes) {
      for (const Shape& s : ShapesFor(a.op)) {
        std::string name = std::string(a.op) + "_" + std::string(a.name) + "_" +
                           std::string(DTypeName(d));
        for (const auto& in : s.inputs) {
          name += "_";
          for (size_t i = 0; i < in.size(); ++i) name += (i ? "x" : "") + std::to_string(in[i]);
        }
        cases.push_back({&a, d, s, name});
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

const AlgoSpec* CpuReference(absl::string_view op) {
  for (const AlgoSpec& a : Algorithms()) {
    if (a.op == op && a.backend == "cpu") return &a;
  }
  return nullptr;
}

class GpuKernelTest : public testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    if (!ProbeCuda(0).ok()) return;
    auto b = MakeCudaBackend(0, 0);
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
Backend* GpuKernelTest::backend_ = nullptr;
ExecEnv* GpuKernelTest::env_ = nullptr;
Backend* GpuKernelTest::cpu_ = nullptr;
ExecEnv* GpuKernelTest::cpu_env_ = nullptr;

// The relative-error bound of each precision.
double Tolerance(const AlgoSpec& a, DType d) {
  if (a.op == "matmul" && absl::StartsWith(a.name, "tensor_core")) {
    return d == DType::kBFloat16 ? 1e-2 : 2e-3;
  }
  return 5e-5;
}

// |x[i]| of an input element of any dtype, for the reductions' error scale.
double AbsAt(const std::string& bytes, DType d, int64_t i) {
  switch (d) {
    case DType::kFloat32: return std::fabs(reinterpret_cast<const float*>(bytes.data())[i]);
    case DType::kBFloat16:
      return std::fabs(op_util::Bf16ToFloat(reinterpret_cast<const uint16_t*>(bytes.data())[i]));
    case DType::kInt32: return std::fabs(double(reinterpret_cast<const int32_t*>(bytes.data())[i]));
    case DType::kInt64: return std::fabs(double(reinterpret_cast<const int64_t*>(bytes.data())[i]));
    default: return 0;
  }
}

TEST_P(GpuKernelTest, MatchesCpuReference) {
  const Case& c = GetParam();
  if (backend_ == nullptr) GTEST_SKIP() << "no usable GPU: " << ProbeCuda(0).message();
  if (c.algo->min_compute_capability > backend_->compute_capability()) {
    GTEST_SKIP() << c.algo->name << " needs sm_" << c.algo->min_compute_capability;
  }
  const OpSpec* op = FindOp(c.algo->op);
  ASSERT_NE(op, nullptr);

  // Inputs on both sides.
  std::vector<TensorMeta> metas;
  std::vector<std::string> host;
  std::vector<BufferPtr> dev;
  std::vector<const void*> dev_ptrs, host_ptrs;
  for (size_t i = 0; i < c.shape.inputs.size(); ++i) {
    metas.push_back({c.dtype, c.shape.inputs[i]});
    host.push_back(RandomBytes(metas.back(), i + 1));
  }
  for (size_t i = 0; i < metas.size(); ++i) {
    auto b = env_->Allocate(metas[i].Bytes());
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(env_->CopyIn(**b, host[i].data(), host[i].size()).ok());
    dev.push_back(*b);
    dev_ptrs.push_back((*b)->data());
    host_ptrs.push_back(host[i].data());
  }
  auto out_meta = op->infer(metas);
  ASSERT_TRUE(out_meta.ok()) << out_meta.status();
  const uint64_t out_bytes = out_meta->Bytes();
  // A row that does not take this shape must refuse it, not run another kernel in its place:
  // validation sends such nodes to the row's fallback, which the response then reports.
  const bool refuses = c.algo->supports != nullptr && !c.algo->supports(metas);

  // Poisoned output between guard bands.
  auto out = env_->Allocate(out_bytes + 2 * kGuardBytes);
  ASSERT_TRUE(out.ok()) << out.status();
  auto stream = static_cast<cudaStream_t>(env_->stream());
  char* d_out = static_cast<char*>((*out)->data());
  ASSERT_EQ(cudaMemsetAsync(d_out, kGuard, kGuardBytes, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d_out + kGuardBytes, kPoison, out_bytes, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d_out + kGuardBytes + out_bytes, kGuard, kGuardBytes, stream), cudaSuccess);

  AttrMap attrs;
  KernelArgs args{dev_ptrs, metas, d_out + kGuardBytes, *out_meta, attrs, *env_};
  env_->MarkStart(0);
  absl::Status run = c.algo->run(args);
  env_->MarkEnd(0);
  auto done = env_->Finish(1);
  if (refuses) {
    EXPECT_FALSE(run.ok()) << c.algo->name << " ran a shape it says it does not take";
    ASSERT_TRUE(done.ok()) << done.status();
    return;
  }
  ASSERT_TRUE(run.ok()) << run;
  ASSERT_TRUE(done.ok()) << done.status();
  std::string got(out_bytes + 2 * kGuardBytes, '\0');
  ASSERT_TRUE(backend_->CopyOut(**out, 0, got.data(), got.size()).ok());
  for (uint64_t i = 0; i < kGuardBytes; ++i) {
    ASSERT_EQ(static_cast<uint8_t>(got[i]), kGuard) << "write before the output at byte -" << (kGuardBytes - i);
    ASSERT_EQ(static_cast<uint8_t>(got[kGuardBytes + out_bytes + i]), kGuard) << "write past the output at byte +" << i;
  }
  const char* result = got.data() + kGuardBytes;

  // The CPU reference row of the same op.
  std::string ref(out_bytes, '\0');
  KernelArgs ref_args{host_ptrs, metas, ref.data(), *out_meta, attrs, *cpu_env_};
  ASSERT_TRUE(CpuReference(c.algo->op)->run(ref_args).ok());
  (void)cpu_env_->Finish(0);

  const int64_t n = out_meta->NumElements();
  if (out_meta->dtype == DType::kFloat32) {
    const auto* y = reinterpret_cast<const float*>(result);
    const auto* r = reinterpret_cast<const float*>(ref.data());
    // Error relative to the magnitude the op accumulates: sum|x| for reductions (so that
    // cancellation cannot hide a wrong answer or fail a right one), ||ref|| otherwise.
    double err = 0;
    if (c.algo->op == "sum" || c.algo->op == "row_sum" || c.algo->op == "row_mean") {
      const int64_t rows = n, cols = metas[0].NumElements() / n;
      const bool mean = c.algo->op == "row_mean";
      for (int64_t i = 0; i < rows; ++i) {
        double abs_sum = 0;
        for (int64_t j = 0; j < cols; ++j) abs_sum += AbsAt(host[0], c.dtype, i * cols + j);
        if (mean) abs_sum /= cols;
        // Integer means: the exact sum, then one division, so ints compare against |mean| too.
        const double e = std::fabs(static_cast<double>(y[i]) - r[i]) / std::max(abs_sum, 1e-300);
        ASSERT_FALSE(std::isnan(y[i])) << "row " << i << " is NaN (never written?)";
        err = std::max(err, e);
      }
    } else if (c.algo->op == "matmul" && metas[0].NumElements() * metas[1].shape[1] <= (1 << 26)) {
      // Small products: the componentwise bound |Y - R| <= tol * (|A| |B|), which stays
      // meaningful when a dot product cancels to nearly zero.
      const int64_t m = metas[0].shape[0], k = metas[0].shape[1], nn = metas[1].shape[1];
      auto at = [&](int idx, int64_t i) -> double {
        if (c.dtype == DType::kBFloat16) {
          return op_util::Bf16ToFloat(reinterpret_cast<const uint16_t*>(host[idx].data())[i]);
        }
        return reinterpret_cast<const float*>(host[idx].data())[i];
      };
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < nn; ++j) {
          double abs_dot = 0;
          for (int64_t p = 0; p < k; ++p) abs_dot += std::fabs(at(0, i * k + p) * at(1, p * nn + j));
          ASSERT_FALSE(std::isnan(y[i * nn + j])) << "element " << i * nn + j << " is NaN (never written?)";
          err = std::max(err, std::fabs(static_cast<double>(y[i * nn + j]) - r[i * nn + j]) / abs_dot);
        }
      }
    } else {
      // Large outputs: the normwise ||Y - R|| / ||R||.
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_FALSE(std::isnan(y[i])) << "element " << i << " is NaN (never written?)";
        diff += (static_cast<double>(y[i]) - r[i]) * (static_cast<double>(y[i]) - r[i]);
        norm += static_cast<double>(r[i]) * r[i];
      }
      err = std::sqrt(diff) / std::sqrt(norm);
    }
    const double tol = Tolerance(*c.algo, c.dtype);
    EXPECT_TRUE(err <= tol) << "relative error " << err << " over " << tol;
    RecordProperty("relative_error", std::to_string(err));
  } else {
    // Integer sums and transposes of any dtype are exact.
    const int cmp = std::memcmp(result, ref.data(), out_bytes);
    if (cmp != 0) {
      const uint64_t es = ElementSize(out_meta->dtype);
      for (uint64_t i = 0; i < out_bytes; i += es) {
        ASSERT_EQ(std::memcmp(result + i, ref.data() + i, es), 0) << "first mismatch at element " << i / es;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, GpuKernelTest, testing::ValuesIn(AllCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuKernelTest);

// FLOAT32 sum: every algorithm the table calls deterministic, and what auto resolves to, must give
// the same bits for the same input, run after run (a float sum's bits depend on its order).
TEST(GpuDeterminism, Float32SumsAreBitwiseRepeatable) {
  if (!ProbeCuda(0).ok()) GTEST_SKIP() << "no usable GPU: " << ProbeCuda(0).message();
  auto backend = MakeCudaBackend(0, 0);
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

}  // namespace
}  // namespace opserve
