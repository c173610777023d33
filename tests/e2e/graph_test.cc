// Execute against the real server: row_mean(transpose(matmul(A, B))) with A stored, B inline and
// the rest intermediates, checked against a float64 reference computed here; outputs returned
// inline and stored; ListOps and the per-node report.
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

constexpr double kU = 0x1p-24;  // float32 unit roundoff

using GraphTest = OpserveTest;

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Run fused (the default: row_mean and transpose both ask for auto, and nothing else reads the
// transpose) and with fuse=false on the transpose: the same answer either way, and the report
// says which ran.
class GraphFuseTest : public OpserveTest, public testing::WithParamInterface<bool> {};

TEST_P(GraphFuseTest, RowMeanOfTransposeOfMatmul) {
  SKIP_UNLESS_CPU_BACKEND("names the reference algorithm");
  const bool fuse = GetParam();
  // Odd sizes: no dimension a multiple of 32.
  constexpr int64_t M = 67, K = 129, N = 33;
  const std::vector<float> a = RandomFloats(M * K, rng_), b = RandomFloats(K * N, rng_);
  ASSERT_TRUE(client().PutTensor("A", F32({M, K}, a), false).ok());

  v1::ExecuteRequest req;
  AddInline(req, "B", F32({K, N}, b));
  // Listed out of order on purpose: the server orders the graph.
  AddNode(req, "mean", "row_mean", {Node("t")});
  v1::Node* t = AddNode(req, "t", "transpose", {Node("mm")}, "auto");
  if (!fuse) (*t->mutable_attrs())["fuse"].set_b(false);
  AddNode(req, "mm", "matmul", {Stored("A"), Inline("B")}, "reference");
  AddOutput(req, "mean", /*return_inline=*/true, /*store_as=*/"col_means");
  AddOutput(req, "mm", /*return_inline=*/false, /*store_as=*/"C");

  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
  ASSERT_TRUE(resp.ok()) << resp.status();

  // The reference: mean over i of C[i][j] = sum_p A[i][p] B[p][j], in float64, with the
  // float32 bound for each C element carried through the mean.
  std::vector<double> c(M * N, 0.0), c_mag(M * N, 0.0), want(N, 0.0), tol(N, 0.0);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t p = 0; p < K; ++p) {
      for (int64_t j = 0; j < N; ++j) {
        c[i * N + j] += double{a[i * K + p]} * b[p * N + j];
        c_mag[i * N + j] += std::abs(double{a[i * K + p]} * b[p * N + j]);
      }
    }
  }
  for (int64_t j = 0; j < N; ++j) {
    double mag = 0;
    for (int64_t i = 0; i < M; ++i) {
      want[j] += c[i * N + j] / M;
      mag += c_mag[i * N + j] / M;
    }
    // K+1 roundings per C element (gamma_{K+1}), M more for a float32 mean, and the division.
    const double g = (K + 1 + M) * kU / (1 - (K + 1 + M) * kU);
    tol[j] = g * mag + 2 * kU * std::abs(want[j]);
  }

  ASSERT_EQ(resp->outputs_size(), 1);
  EXPECT_EQ(resp->outputs(0).node(), "mean");
  const v1::Tensor& out = resp->outputs(0).tensor();
  EXPECT_EQ(out.dtype(), v1::FLOAT32);
  ASSERT_EQ(std::vector<int64_t>(out.shape().begin(), out.shape().end()), std::vector<int64_t>{N});
  const std::vector<float> got = Floats(out.data());
  ASSERT_EQ(got.size(), static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) {
    EXPECT_FALSE(std::isnan(got[j])) << j;
    EXPECT_NEAR(got[j], want[j], tol[j]) << "column " << j;
  }

  // Per node, in execution order.
  ASSERT_EQ(resp->nodes_size(), 3);
  const char* ids[] = {"mm", "t", "mean"};
  const char* ops[] = {"matmul", "transpose", "row_mean"};
  const std::vector<std::vector<int64_t>> shapes = {{M, N}, {N, M}, {N}};
  // Fused, the transpose and the mean both report the column mean's kernel: X read once.
  const uint64_t col_mean_bytes = (M * N + N) * 4u;
  const uint64_t bytes[] = {(M * K + K * N + M * N) * 4u, fuse ? col_mean_bytes : 2u * M * N * 4,
                            col_mean_bytes};
  const uint64_t flops[] = {2u * M * N * K, fuse ? static_cast<uint64_t>(M * N) : 0,
                            static_cast<uint64_t>(M * N)};
  const char* algorithms[] = {"reference", fuse ? "fused:col_mean" : "reference",
                              fuse ? "fused:col_mean" : "reference"};
  const char* fused_into[] = {"", fuse ? "mean" : "", ""};
  for (int i = 0; i < 3; ++i) {
    const v1::NodeResult& r = resp->nodes(i);
    EXPECT_EQ(r.id(), ids[i]);
    EXPECT_EQ(r.op(), ops[i]);
    EXPECT_EQ(r.algorithm(), algorithms[i]) << "auto and empty map to reference on the cpu";
    EXPECT_EQ(r.fused_into(), fused_into[i]) << ids[i];
    EXPECT_EQ(r.dtype(), v1::FLOAT32);
    EXPECT_EQ(std::vector<int64_t>(r.shape().begin(), r.shape().end()), shapes[i]) << ids[i];
    EXPECT_EQ(r.bytes(), bytes[i]) << ids[i];
    EXPECT_EQ(r.flops(), flops[i]) << ids[i];
    EXPECT_GE(r.kernel_us(), 0) << ids[i];
    EXPECT_GE(r.gbps(), 0) << ids[i];
    EXPECT_GE(r.gflops(), 0) << ids[i];
  }
  EXPECT_GT(resp->timing().total_us(), 0);
  EXPECT_GE(resp->timing().queue_us(), 0);
  EXPECT_GE(resp->timing().compute_us(), 0);
  EXPECT_EQ(resp->device(), ExpectedDevice());

  // Stored outputs: reported, listed, and readable with the same bytes.
  std::set<std::string> stored;
  for (const v1::TensorInfo& info : resp->stored()) stored.insert(info.name());
  EXPECT_EQ(stored, (std::set<std::string>{"C", "col_means"}));
  absl::StatusOr<client::HostTensor> means = client().GetTensor("col_means");
  ASSERT_TRUE(means.ok()) << means.status();
  EXPECT_EQ(means->shape, std::vector<int64_t>{N});
  EXPECT_TRUE(means->data == out.data()) << "stored and returned outputs differ";
  absl::StatusOr<client::HostTensor> stored_c = client().GetTensor("C");
  ASSERT_TRUE(stored_c.ok()) << stored_c.status();
  EXPECT_EQ(stored_c->shape, (std::vector<int64_t>{M, N}));
  const std::vector<float> cg = Floats(stored_c->data);
  ASSERT_EQ(cg.size(), static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M * N; ++i) {
    EXPECT_NEAR(cg[i], c[i], (K + 1) * kU * c_mag[i] * 1.01) << "C element " << i;
  }
  // The stored result feeds a later request.
  v1::ExecuteRequest again;
  AddNode(again, "s", "row_sum", {Stored("C")});
  AddOutput(again, "s", true);
  absl::StatusOr<v1::ExecuteResponse> r2 = client().Execute(again);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->outputs(0).tensor().shape(0), M);
}

INSTANTIATE_TEST_SUITE_P(FusedAndNot, GraphFuseTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "fused" : "fuse_false";
                         });

TEST_F(GraphTest, EveryOpAndDtypeThroughTheServer) {
  SKIP_UNLESS_CPU_BACKEND("INT64 transpose and reference rows");
  // Small exact cases: the server's path (inline upload, kernel, download) for each op/dtype.
  v1::ExecuteRequest req;
  AddInline(req, "f", F32({2, 3}, {1, 2, 3, 4, 5, 6}));
  client::HostTensor i32{v1::INT32, {2, 2}, std::string(16, '\0')};
  const int32_t iv[] = {2147483647, 2147483647, 5, -1};
  std::memcpy(i32.data.data(), iv, 16);
  AddInline(req, "i", i32);
  client::HostTensor i64{v1::INT64, {1, 2}, std::string(16, '\0')};
  const int64_t lv[] = {int64_t{1} << 40, -3};
  std::memcpy(i64.data.data(), lv, 16);
  AddInline(req, "l", i64);
  client::HostTensor bf{v1::BFLOAT16, {2, 2}, std::string(8, '\0')};
  const uint16_t bv[] = {0x3F80, 0x4000, 0x4040, 0x4080};  // 1 2 3 4
  std::memcpy(bf.data.data(), bv, 8);
  AddInline(req, "b", bf);
  AddNode(req, "sum_f", "sum", {Inline("f")});
  AddNode(req, "sum_i", "sum", {Inline("i")});
  AddNode(req, "rs", "row_sum", {Inline("f")});
  AddNode(req, "rm", "row_mean", {Inline("f")});
  AddNode(req, "tf", "transpose", {Inline("f")});
  AddNode(req, "tl", "transpose", {Inline("l")});
  AddNode(req, "tb", "transpose", {Inline("b")});
  AddNode(req, "mb", "matmul", {Inline("b"), Inline("b")});
  for (const char* id : {"sum_f", "sum_i", "rs", "rm", "tf", "tl", "tb", "mb"})
    AddOutput(req, id, true);
  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  std::map<std::string, v1::Tensor> out;
  for (const v1::NamedTensor& t : resp->outputs()) out[t.node()] = t.tensor();
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(Floats(out["sum_f"].data()), std::vector<float>{21});
  EXPECT_EQ(out["sum_i"].dtype(), v1::INT64);
  int64_t sum_i = 0;
  std::memcpy(&sum_i, out["sum_i"].data().data(), 8);
  EXPECT_EQ(sum_i, 2LL * 2147483647 + 4);
  EXPECT_EQ(Floats(out["rs"].data()), (std::vector<float>{6, 15}));
  EXPECT_EQ(Floats(out["rm"].data()), (std::vector<float>{2, 5}));
  EXPECT_EQ(Floats(out["tf"].data()), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  int64_t tl[2];
  std::memcpy(tl, out["tl"].data().data(), 16);
  EXPECT_EQ(tl[0], int64_t{1} << 40);
  EXPECT_EQ(tl[1], -3);
  uint16_t tb[4];
  std::memcpy(tb, out["tb"].data().data(), 8);
  EXPECT_EQ(std::vector<uint16_t>(tb, tb + 4),
            (std::vector<uint16_t>{0x3F80, 0x4040, 0x4000, 0x4080}));
  EXPECT_EQ(out["mb"].dtype(), v1::FLOAT32);
  EXPECT_EQ(Floats(out["mb"].data()), (std::vector<float>{7, 10, 15, 22}));
}

TEST_F(GraphTest, ListOps) {
  SKIP_UNLESS_CPU_BACKEND("expects the reference defaults");
  absl::StatusOr<v1::ListOpsResponse> ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->backend(), "cpu");
  EXPECT_FALSE(ops->device().empty());
  // The op table's ops and, per op, the dtypes the CPU backend's rows run.
  std::unique_ptr<Backend> cpu = MakeCpuBackend(0);
  std::map<std::string, std::set<int>> want;
  for (const OpSpec& op : Ops()) {
    for (DType d : DTypesFor(op.name, *cpu)) want[std::string(op.name)].insert(static_cast<int>(d));
  }
  ASSERT_FALSE(want.empty()) << "the op table is empty";
  std::set<std::string> seen;
  for (const v1::OpInfo& op : ops->ops()) {
    SCOPED_TRACE(op.name());
    seen.insert(op.name());
    ASSERT_EQ(want.count(op.name()), 1u) << "unexpected op";
    EXPECT_EQ(std::set<int>(op.dtypes().begin(), op.dtypes().end()), want.at(op.name()));
    EXPECT_EQ(op.default_algorithm(), "reference");
    EXPECT_FALSE(op.description().empty());
    bool found = false;
    for (const v1::AlgorithmInfo& a : op.algorithms()) {
      if (a.name() != "reference") continue;
      found = true;
      EXPECT_TRUE(a.is_default());
      EXPECT_TRUE(a.deterministic());
      EXPECT_EQ(std::set<int>(a.dtypes().begin(), a.dtypes().end()), want.at(op.name()));
    }
    EXPECT_TRUE(found) << "no 'reference' algorithm";
  }
  EXPECT_EQ(seen.size(), want.size());
}

TEST_F(GraphTest, HealthServing) {
  absl::StatusOr<bool> serving = client().HealthServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

}  // namespace
}  // namespace opserve::e2e
