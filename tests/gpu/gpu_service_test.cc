// The service on the CUDA backend, end to end: the real `opserve --device=cuda` driven through
// the client library. Skipped (not passed) where no GPU is usable.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include "server/ops/op.h"
#include "tests/gpu/gpu_server_fixture.h"
#include "tests/gpu/suite_device.h"

namespace opserve::e2e {
namespace {

using GpuServiceTest = GpuServerTest;

std::vector<double> MatmulRef(const client::HostTensor& a, const client::HostTensor& b) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
  const std::vector<float> x = Floats(a.data), y = Floats(b.data);
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += double(x[i * k + p]) * y[p * n + j];
  return c;
}

// ListOps on a GPU server lists every cuda row of the table the device runs (all of them on a
// Hopper, the suite's cap aside), with defaults and determinism.
TEST_F(GpuServiceTest, ListOpsListsEveryCudaAlgorithm) {
  const gpu_suite::SuiteDevice device;
  auto ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->backend(), "cuda");
  std::set<std::string> listed;
  for (const v1::OpInfo& op : ops->ops()) {
    EXPECT_FALSE(op.default_algorithm().empty()) << op.name();
    for (const v1::AlgorithmInfo& a : op.algorithms()) {
      listed.insert(op.name() + "/" + a.name());
      const bool atomic = a.name() == "one_pass_atomic";
      EXPECT_EQ(a.deterministic(), !atomic) << op.name() << "/" << a.name();
    }
  }
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend != "cuda") continue;
    EXPECT_EQ(listed.count(std::string(a.op) + "/" + std::string(a.name)),
              device.Runs(a.op, a.name) ? 1u : 0u)
        << a.op << "/" << a.name << " (needs " << ComputeCapabilityName(a.min_compute_capability)
        << ") on a device of " << ComputeCapabilityName(device.compute_capability());
  }
}

// row_mean(transpose(matmul(A, B))) with A stored on the GPU, B inline, the rest intermediates,
// for auto and for named algorithms, against a float64 reference; the product is also stored
// and read back.
TEST_F(GpuServiceTest, MixedStoredInlineIntermediateGraph) {
  const client::HostTensor a = RandomFloats({300, 129}, rng_);
  const client::HostTensor b = RandomFloats({129, 77}, rng_);
  ASSERT_TRUE(client().PutTensor("A", a, false).ok());
  const std::vector<double> ab = MatmulRef(a, b);
  const int64_t m = 300, n = 77;
  const gpu_suite::SuiteDevice device;
  for (const auto& [mm, tr, rm] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"auto", "auto", "auto"},
           {"block_tiled_vectorized", "smem_tiled", "warp_per_row"},
           {"cublas", "tma", "cub_segmented"},
           {"tiled", "swizzled", "block_per_row"}}) {
    SCOPED_TRACE(mm + "/" + tr + "/" + rm);
    if (!device.Runs("transpose", tr)) continue;  // tma below 9.0 (the suite's cap)
    v1::ExecuteRequest req;
    AddInline(req, "B", b);
    AddNode(req, "ab", "matmul", {Stored("A"), Inline("B")}, mm);
    AddNode(req, "abt", "transpose", {Node("ab")}, tr);
    AddNode(req, "mean", "row_mean", {Node("abt")}, rm);
    AddOutput(req, "mean", true);
    AddOutput(req, "ab", false, "AB", true);
    auto resp = client().Execute(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->nodes_size(), 3);
    for (const v1::NodeResult& r : resp->nodes()) {
      EXPECT_NE(r.algorithm(), "auto");
      EXPECT_GT(r.kernel_us(), 0) << r.id();
      EXPECT_GT(r.bytes(), 0u) << r.id();
    }
    ASSERT_EQ(resp->outputs_size(), 1);
    const std::vector<float> got = Floats(resp->outputs(0).tensor().data());
    ASSERT_EQ(static_cast<int64_t>(got.size()), n);
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t i = 0; i < m; ++i) ref += ab[i * n + j];
      ref /= m;
      EXPECT_NEAR(got[j], ref, 1e-4 + 1e-4 * std::fabs(ref)) << "column " << j;
    }
    auto stored = client().GetTensor("AB");
    ASSERT_TRUE(stored.ok()) << stored.status();
    const std::vector<float> c = Floats(stored->data);
    for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(c[i], ab[i], 1e-4 + 1e-4 * std::fabs(ab[i])) << i;
  }
}

// Tensors of every dtype survive a round trip through GPU memory, 1 GiB included.
TEST_F(GpuServiceTest, RoundTripsThroughGpuMemory) {
  for (v1::DType d : {v1::FLOAT32, v1::INT32, v1::INT64, v1::BFLOAT16}) {
    const client::HostTensor t = RandomTensor(d, {3, 5, 7, 11}, rng_);
    ASSERT_TRUE(client().PutTensor("t", t, true).ok());
    auto back = client().GetTensor("t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->data, t.data) << v1::DType_Name(d);
  }
  client::HostTensor big = RandomTensor(v1::INT32, {1 << 28}, rng_);  // 1 GiB
  ASSERT_TRUE(client().PutTensor("big", big, false).ok());
  auto back = client().GetTensor("big");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == big.data);
  auto infos = client().ListTensors();
  ASSERT_TRUE(infos.ok());
  for (const v1::TensorInfo& i : *infos) EXPECT_EQ(i.device(), ExpectedDevice());
}

// cuBLAS loads its kernels on first use: a fresh server's first 4096^3 FLOAT32 cuBLAS node took
// ~97 ms on the H200 where a warm one takes ~2.7 ms. The CUDA worker warms cuBLAS up at start,
// so the first cuBLAS node of each dtype on a fresh server (one per test) runs at speed.
TEST_F(GpuServiceTest, FirstCublasMatmulOfAFreshServerIsWarm) {
  constexpr int64_t n = 4096;
  const client::HostTensor a = RandomFloats({n, n}, rng_);
  const client::HostTensor b = RandomFloats({n, n}, rng_);
  // BFLOAT16: the top half of each float (truncation), never zero or NaN for these inputs.
  auto to_bf16 = [](const client::HostTensor& t) {
    client::HostTensor h{v1::BFLOAT16, t.shape, std::string(t.data.size() / 2, '\0')};
    for (size_t i = 0; i < t.data.size() / 4; ++i) std::memcpy(&h.data[2 * i], &t.data[4 * i + 2], 2);
    return h;
  };
  ASSERT_TRUE(client().PutTensor("a", a, false).ok());
  ASSERT_TRUE(client().PutTensor("b", b, false).ok());
  ASSERT_TRUE(client().PutTensor("ah", to_bf16(a), false).ok());
  ASSERT_TRUE(client().PutTensor("bh", to_bf16(b), false).ok());
  for (const auto& [x, y] : {std::pair<std::string, std::string>{"a", "b"}, {"ah", "bh"}}) {
    v1::ExecuteRequest req;
    AddNode(req, "c", "matmul", {Stored(x), Stored(y)}, "cublas");
    AddOutput(req, "c", false, x + "_c", true);
    auto resp = client().Execute(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->nodes_size(), 1);
    EXPECT_LT(resp->nodes(0).kernel_us(), 20000) << x << ": the first cuBLAS call was cold";
    std::cout << "[ WARM     ] first cuBLAS " << n << "^3 " << (x == "a" ? "FLOAT32" : "BFLOAT16")
              << " on a fresh server: " << resp->nodes(0).kernel_us() << " us" << std::endl;
  }
}

// Where a row does not take a shape, the node runs its fallback and the response, the metrics
// label and the bench all name the fallback: the algorithm that ran, never the one asked for.
TEST_F(GpuServiceTest, FallbacksReportTheAlgorithmThatRan) {
  struct Case {
    std::string op, algorithm;
    std::vector<std::vector<int64_t>> shapes;
    std::string reported;
  };
  const Case cases[] = {
      {"transpose", "tma", {{300, 77}}, "smem_tiled"},    // 308-byte rows: TMA cannot describe
      {"transpose", "tma", {{300, 76}}, "tma"},
      {"matmul", "tensor_core_sm90a", {{64, 64}, {64, 64}}, "tensor_core"},  // K < 256
      {"matmul", "tensor_core_sm90a", {{2048, 1023}, {1023, 2048}}, "tensor_core"},
      {"matmul", "tensor_core_sm90a", {{2048, 512}, {512, 2048}}, "tensor_core_sm90a"},
      {"matmul", "tensor_core", {{2048, 512}, {512, 2048}}, "tensor_core"},
  };
  const gpu_suite::SuiteDevice device;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + "/" + c.algorithm);
    if (!device.Runs(c.op, c.algorithm)) continue;  // Hopper rows below 9.0 (the suite's cap)
    v1::ExecuteRequest req;
    std::vector<In> ins;
    std::vector<client::HostTensor> hosts;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      hosts.push_back(RandomFloats(c.shapes[i], rng_));
      AddInline(req, "x" + std::to_string(i), hosts.back());
      ins.push_back(Inline("x" + std::to_string(i)));
    }
    AddNode(req, "n", c.op, ins, c.algorithm);
    AddOutput(req, "n", true);
    auto resp = client().Execute(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->nodes(0).algorithm(), c.reported);
    EXPECT_GT(resp->nodes(0).kernel_us(), 0);
    if (c.op == "matmul") {  // the fallback computes the same product
      const std::vector<double> want = MatmulRef(hosts[0], hosts[1]);
      const std::vector<float> got = Floats(resp->outputs(0).tensor().data());
      double diff = 0, norm = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
      }
      EXPECT_LT(std::sqrt(diff / norm), 2e-3);
    }
  }
}

// An error on the GPU server is the same error, and the server keeps serving.
TEST_F(GpuServiceTest, ErrorsKeepTheirCodes) {
  v1::ExecuteRequest req;
  AddNode(req, "s", "sum", {Stored("missing")});
  AddOutput(req, "s", true);
  EXPECT_TRUE(StatusIs(client().Execute(req).status(), absl::StatusCode::kNotFound, {"'missing'"}));
  // A dtype the row does not run (two_pass sums FLOAT32 and INT32), on every capability.
  v1::ExecuteRequest bad;
  AddInline(bad, "x", v1::INT64, {4, 4});
  AddNode(bad, "t", "sum", {Inline("x")}, "two_pass");
  AddOutput(bad, "t", true);
  EXPECT_TRUE(StatusIs(client().Execute(bad).status(), absl::StatusCode::kUnimplemented, {"'t'", "INT64"}));
  EXPECT_TRUE(Serving());
}

// --max_compute_capability=8.0: the server offers what an A100 runs, whatever the GPU. ListOps
// names the cap and lists no row that needs more; naming a Hopper row answers UNIMPLEMENTED with
// both capabilities; `auto` takes the rows of 8.0 and runs them.
class GpuCappedTest : public GpuServiceTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--max_compute_capability=8.0"}; }
};

TEST_F(GpuCappedTest, OffersOnlyTheRowsOfTheCap) {
  auto ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->backend(), "cuda");
  int listed = 0;
  for (const v1::OpInfo& op : ops->ops()) {
    for (const v1::AlgorithmInfo& a : op.algorithms()) {
      const AlgoSpec* row = nullptr;
      for (const AlgoSpec& r : Algorithms()) {
        if (r.backend == "cuda" && r.op == op.name() && r.name == a.name()) row = &r;
      }
      ASSERT_NE(row, nullptr) << op.name() << "/" << a.name() << " is not a cuda row";
      EXPECT_LE(row->min_compute_capability, 80) << op.name() << "/" << a.name();
      ++listed;
    }
  }
  EXPECT_GT(listed, 20);
  // The device names its own capability and the cap (unless the GPU's own is 8.0 already).
  if (ops->device().find("capped to 8.0 by --max_compute_capability") == std::string::npos) {
    EXPECT_NE(ops->device().find("(sm_80"), std::string::npos) << ops->device();
  }

  const client::HostTensor x = RandomTensor(v1::FLOAT32, {64, 64}, rng_);
  v1::ExecuteRequest tma;
  AddInline(tma, "x", x);
  AddNode(tma, "t", "transpose", {Inline("x")}, "tma");
  AddOutput(tma, "t", true);
  EXPECT_TRUE(StatusIs(client().Execute(tma).status(), absl::StatusCode::kUnimplemented,
                       {"'tma' needs compute capability 9.0", ") is 8.0", "smem_tiled"}));

  v1::ExecuteRequest sm90a;
  AddInline(sm90a, "a", RandomTensor(v1::FLOAT32, {2048, 512}, rng_));
  AddInline(sm90a, "b", RandomTensor(v1::FLOAT32, {512, 2048}, rng_));
  AddNode(sm90a, "m", "matmul", {Inline("a"), Inline("b")}, "tensor_core_sm90a");
  AddOutput(sm90a, "m", true);
  EXPECT_TRUE(StatusIs(client().Execute(sm90a).status(), absl::StatusCode::kUnimplemented,
                       {"tensor_core_sm90a", "is 8.0"}));

  v1::ExecuteRequest auto_t;
  AddInline(auto_t, "x", x);
  AddNode(auto_t, "t", "transpose", {Inline("x")});
  AddOutput(auto_t, "t", true);
  auto resp = client().Execute(auto_t);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->nodes(0).algorithm(), "smem_tiled");
  const std::string& in = x.data;
  const std::string& out = resp->outputs(0).tensor().data();
  ASSERT_EQ(out.size(), in.size());
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      ASSERT_EQ(std::memcmp(&out[(c * 64 + r) * 4], &in[(r * 64 + c) * 4], 4), 0) << r << "," << c;
    }
  }
  EXPECT_TRUE(Serving());
}

#if OPSERVE_TEST_HOOKS
class GpuStickyFaultTest : public GpuServiceTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--test_fail_algorithm=sum/vectorized"};
  }
};

// An illegal address on the device fails its own request, naming the node, and turns health to
// NOT_SERVING: the CUDA context is gone until the process restarts.
TEST_F(GpuStickyFaultTest, IllegalAddressTurnsHealthNotServing) {
  ASSERT_TRUE(Serving());
  const client::HostTensor x = RandomFloats({1000}, rng_);
  v1::ExecuteRequest req;
  AddInline(req, "x", x);
  AddNode(req, "s", "sum", {Inline("x")}, "vectorized");
  AddOutput(req, "s", true);
  auto r = client().Execute(req);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'s'"), std::string::npos) << r.status();
  auto serving = client().HealthServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  EXPECT_TRUE(StatusIs(client().Execute(req).status(), absl::StatusCode::kUnavailable));
}

class GpuStickyFaultUnderLoadTest : public GpuServiceTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--test_fail_algorithm=sum/vectorized", "--lanes=4"};
  }
};

// The same fault while other lanes run matmuls: every request either succeeds with the right
// answer (it finished before the fault) or fails; none returns wrong data, the server keeps
// running, health turns NOT_SERVING, and afterwards every request is refused.
TEST_F(GpuStickyFaultUnderLoadTest, FaultDuringConcurrentLoadFailsInFlightRequests) {
  ASSERT_TRUE(Serving());
  constexpr int64_t n = 512;
  auto col_sums = StoreExactMatmulInputs(client(), "a", "b", n, rng_);
  ASSERT_TRUE(col_sums.ok()) << col_sums.status();
  v1::ExecuteRequest mm;
  AddNode(mm, "p", "matmul", {Stored("a"), Stored("b")}, "naive");
  AddOutput(mm, "p", true);
  std::atomic<bool> stop{false};
  // Failed in flight: planned before health turned, then failed by the device error; the others
  // were refused at the door (UNAVAILABLE) once it had.
  std::atomic<int> ok{0}, failed{0}, failed_in_flight{0}, wrong{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 6; ++t) {
    load.emplace_back([&] {
      client::ClientOptions o;
      o.target = server().target();
      auto c = client::Client::Connect(o);
      if (!c.ok()) return;
      while (!stop.load()) {
        auto r = (*c)->Execute(mm);
        if (!r.ok()) {
          ++failed;
          if (r.status().code() != absl::StatusCode::kUnavailable) ++failed_in_flight;
          continue;
        }
        if (IsExactMatmul(*r, n, *col_sums)) ++ok; else ++wrong;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  v1::ExecuteRequest bad;
  AddInline(bad, "x", RandomFloats({1000}, rng_));
  AddNode(bad, "s", "sum", {Inline("x")}, "vectorized");
  AddOutput(bad, "s", true);
  EXPECT_FALSE(client().Execute(bad).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (std::thread& t : load) t.join();
  EXPECT_GT(ok.load(), 0) << "no load ran before the fault";
  EXPECT_GT(failed.load(), 0) << "no request failed after the fault";
  EXPECT_GT(failed_in_flight.load(), 0) << "no request in flight on another lane saw the fault";
  EXPECT_EQ(wrong.load(), 0) << "a request returned wrong data across the fault";
  auto serving = client().HealthServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  EXPECT_FALSE(client().Execute(mm).ok());
  EXPECT_TRUE(server().Alive());
}
#endif

}  // namespace
}  // namespace opserve::e2e
