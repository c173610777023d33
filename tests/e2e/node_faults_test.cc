// A sticky fault on one device (the test builds' --test_fail_device=NAME@K, which injects one as a
// faulty kernel would on the K-th request that runs there) stays on that device: the request
// that hit it fails INTERNAL; from then on whatever needs that device answers UNAVAILABLE naming
// it, and the other devices keep serving, alone and under concurrent load, with gRPC health
// SERVING and ListOps / ServerMetadata saying which device is out and why. That holds for
// devices that share no process-wide state (the CPU devices). On GPUs a sticky CUDA error is the
// process's: the runtime fails every later call on every GPU of the process, so a fault on one
// GPU takes them all out, each saying why, and health turns NOT_SERVING (the last test).
#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/node_fixture.h"

namespace opserve::e2e {
namespace {

using Code = absl::StatusCode;

// The device the fault is injected on: index 1, named before the server lists its devices.
std::string FaultyDevice() {
  return absl::StrCat(OpserveTest::Device() == "cpu" ? "cpu" : "cuda", ":1");
}

class NodeFaultTest : public NodeTest {
 protected:
  // The K-th request on the faulty device faults.
  virtual int FaultAt() const { return 2; }
  std::vector<std::string> NodeFlags() const override {
    return {absl::StrCat("--test_fail_device=", FaultyDevice(), "@", FaultAt())};
  }

  // The devices still serving: every one but the faulty one, in order.
  std::vector<std::string> Healthy() const {
    std::vector<std::string> names;
    for (const std::string& d : devices()) {
      if (d != FaultyDevice()) names.push_back(d);
    }
    return names;
  }

  // ListOps and ServerMetadata: the faulty device out with its error, the others serving.
  void ExpectOnlyTheFaultyDeviceOut() {
    absl::StatusOr<v1::ListOpsResponse> ops = node().ListOps();
    ASSERT_TRUE(ops.ok()) << ops.status();
    ASSERT_EQ(ops->devices_size(), n());
    for (const v1::DeviceInfo& d : ops->devices()) {
      SCOPED_TRACE(absl::StrCat("ListOps: ", d.name()));
      EXPECT_EQ(d.serving(), d.name() != FaultyDevice());
      if (d.serving()) {
        EXPECT_EQ(d.error(), "");
      } else {
        EXPECT_NE(d.error(), "") << "a device out of service says why";
      }
    }
    absl::StatusOr<inference::ServerMetadataResponse> meta = node().ServerMetadata();
    ASSERT_TRUE(meta.ok()) << meta.status();
    ASSERT_EQ(meta->devices_size(), n());
    for (const inference::ServerDevice& d : meta->devices()) {
      SCOPED_TRACE(absl::StrCat("ServerMetadata: ", d.name()));
      EXPECT_EQ(d.serving(), d.name() != FaultyDevice());
      EXPECT_EQ(d.error() == "", d.serving());
    }
  }
};

// Why the isolation tests do not run on GPUs.
constexpr char kCudaFaultsAreProcessWide[] =
    "a sticky CUDA error fails every GPU of the process (CudaStickyFaultEndsEveryGpu)";

TEST_P(NodeFaultTest, AFaultedDeviceAnswersUnavailableAndTheOthersServe) {
#if !OPSERVE_TEST_HOOKS
  GTEST_SKIP() << "opserve was built without OPSERVE_TEST_HOOKS";
#endif
  if (IsCuda()) GTEST_SKIP() << kCudaFaultsAreProcessWide;
  ASSERT_EQ(dev(1), FaultyDevice());
  const client::HostTensor x0 = RandomValues(v1::FLOAT32, {48, 40}, rng_);
  const client::HostTensor x1 = RandomValues(v1::FLOAT32, {48, 40}, rng_);
  const client::HostTensor s = RandomValues(v1::INT32, {2L * n() + 1, 9}, rng_);
  ASSERT_TRUE(node().Put("x0", x0, {.device = dev(0)}).ok());
  ASSERT_TRUE(node().Put("x1", x1, {.device = dev(1)}).ok());
  ASSERT_TRUE(node().Put("s", s, {.shard = true}).ok());
  ASSERT_TRUE(node().Put("w1", RandomValues(v1::FLOAT32, {40, 8}, rng_), {.device = dev(1)}).ok());

  // The first request on the faulty device runs; the second hits the fault.
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("row_sum", {Stored("x1")}));
  ASSERT_TRUE(r.ok()) << "the request before the fault: " << r.status();
  EXPECT_EQ(r->device(), dev(1));
  // The same graph again: on a GPU a replay of the graph the first one captured.
  absl::StatusOr<v1::ExecuteResponse> hit = node().Execute(OneNode("row_sum", {Stored("x1")}));
  EXPECT_TRUE(StatusIs(hit.status(), Code::kInternal))
      << "the request that hits the fault"
      << (hit.ok() ? absl::StrCat(" answered on ", hit->device(), " (",
                                  v1::GraphReplay_Name(hit->graph()), ")")
                   : "");

  // Everything that needs the faulty device: UNAVAILABLE, naming it.
  const std::string out = dev(1);
  EXPECT_TRUE(StatusIs(node().Execute(OneNode("row_sum", {Stored("x1")})).status(),
                       Code::kUnavailable, {out}));
  EXPECT_TRUE(StatusIs(node().Get("x1").status(), Code::kUnavailable, {out}));
  EXPECT_TRUE(StatusIs(node().Get("s").status(), Code::kUnavailable, {out})) << "a shard is there";
  EXPECT_TRUE(StatusIs(node().Execute(OneNode("row_sum", {Stored("s")})).status(),
                       Code::kUnavailable, {out}));
  EXPECT_TRUE(StatusIs(node().Put("y", x0, {.device = out}).status(), Code::kUnavailable, {out}));
  EXPECT_TRUE(StatusIs(node().Move("x0", out).status(), Code::kUnavailable, {out}));
  EXPECT_TRUE(StatusIs(node().Move("x1", dev(0)).status(), Code::kUnavailable, {out}));
  // A graph on a healthy device with an input to copy from the faulty one.
  EXPECT_TRUE(StatusIs(node().Execute(OneNode("matmul", {Stored("x0"), Stored("w1")})).status(),
                       Code::kUnavailable, {out}));

  // The others keep serving: stored inputs, reads, placement, inline graphs, sharding.
  r = node().Execute(OneNode("row_sum", {Stored("x0")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device(), dev(0));
  EXPECT_TRUE(MatchesReference("row_sum", {x0}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
  absl::StatusOr<GotTensor> got = node().Get("x0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->tensor.data == x0.data);
  for (int i = 0; i < 2 * n(); ++i) {
    absl::StatusOr<v1::TensorInfo> info = node().Put(absl::StrCat("p", i), x0);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_NE(info->device(), out) << "placement skips the device that is out";
  }
  std::set<std::string> ran;
  for (int i = 0; i < 4 * n(); ++i) {
    v1::ExecuteRequest req;
    AddInline(req, "x", x0);
    AddNode(req, "n", "row_mean", {Inline("x")});
    AddOutput(req, "n", true);
    r = node().Execute(req);
    ASSERT_TRUE(r.ok()) << "inline request " << i << ": " << r.status();
    ran.insert(r->device());
  }
  const std::vector<std::string> healthy = Healthy();
  EXPECT_EQ(ran, std::set<std::string>(healthy.begin(), healthy.end()))
      << "inline requests spread over the serving devices only";
  // A new sharded tensor splits over the serving devices.
  const client::HostTensor s2 = RandomValues(v1::FLOAT32, {2L * n() + 1, 7}, rng_);
  absl::StatusOr<v1::TensorInfo> sharded = node().Put("s2", s2, {.shard = true});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_TRUE(ShardedAs(*sharded, s2.shape[0], 7 * 4, healthy));
  r = node().Execute(OneNode("row_sum", {Stored("s2")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(MatchesReference("row_sum", {s2}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));

  absl::StatusOr<std::vector<v1::TensorInfo>> list = node().List();
  ASSERT_TRUE(list.ok()) << "ListTensors needs no device: " << list.status();
  EXPECT_TRUE(Serving()) << "health stays SERVING while any device serves";
  ExpectOnlyTheFaultyDeviceOut();
}

// Load on every device while the fault strikes: each request placed on a healthy device succeeds
// with the right answer; those on the faulty one succeed before it, and fail after.
class NodeFaultUnderLoadTest : public NodeFaultTest {
 protected:
  int FaultAt() const override { return 6; }
};

TEST_P(NodeFaultUnderLoadTest, RequestsOnHealthyDevicesAllSucceed) {
#if !OPSERVE_TEST_HOOKS
  GTEST_SKIP() << "opserve was built without OPSERVE_TEST_HOOKS";
#endif
  if (IsCuda()) GTEST_SKIP() << kCudaFaultsAreProcessWide;
  ASSERT_EQ(dev(1), FaultyDevice());
  std::vector<client::HostTensor> x;
  for (int d = 0; d < n(); ++d) {
    x.push_back(RandomValues(v1::FLOAT32, {192, 192}, rng_));
    ASSERT_TRUE(node().Put(absl::StrCat("x", d), x.back(), {.device = dev(d)}).ok());
  }
  constexpr int kThreadsPerDevice = 2, kRequests = 12;
  std::mutex mu;
  std::vector<std::string> healthy_failures;
  std::map<Code, int> faulty_codes;
  std::map<std::string, int> faulty_graphs;  // how its successes ran, to tell a replay apart
  std::vector<std::thread> pool;
  for (int d = 0; d < n(); ++d) {
    for (int t = 0; t < kThreadsPerDevice; ++t) {
      pool.emplace_back([&, d] {
        NodeClient c(server().target());
        const std::string name = absl::StrCat("x", d);
        for (int i = 0; i < kRequests; ++i) {
          absl::StatusOr<v1::ExecuteResponse> r =
              c.Execute(OneNode("matmul", {Stored(name), Stored(name)}));
          std::lock_guard<std::mutex> lock(mu);
          if (dev(d) == FaultyDevice()) {
            ++faulty_codes[r.status().code()];
            if (r.ok()) ++faulty_graphs[v1::GraphReplay_Name(r->graph())];
            continue;
          }
          if (!r.ok()) {
            healthy_failures.push_back(
                absl::StrCat(dev(d), " request ", i, ": ", r.status().ToString()));
          } else if (r->device() != dev(d)) {
            healthy_failures.push_back(absl::StrCat("x", d, " ran on ", r->device()));
          } else if (::testing::AssertionResult m = MatchesReference(
                         "matmul", {x[d], x[d]}, Output(*r, "n"), NodeReport(*r, "n").algorithm());
                     !m) {
            healthy_failures.push_back(absl::StrCat(dev(d), ": ", m.message()));
          }
        }
      });
    }
  }
  for (std::thread& t : pool) t.join();
  EXPECT_TRUE(healthy_failures.empty())
      << healthy_failures.size()
      << " requests on healthy devices failed; the first: " << healthy_failures[0];
  std::string codes;
  for (const auto& [code, k] : faulty_codes) {
    absl::StrAppend(&codes, absl::StatusCodeToString(code), ": ", k, "; ");
  }
  for (const auto& [graph, k] : faulty_graphs) absl::StrAppend(&codes, graph, ": ", k, "; ");
  EXPECT_GE(faulty_codes[Code::kOk], FaultAt() - 1) << codes;
  EXPECT_GE(faulty_codes[Code::kInternal], 1) << "the request that hit the fault; " << codes;
  EXPECT_GE(faulty_codes[Code::kUnavailable], 1) << "requests after it; " << codes;
  EXPECT_EQ(
      faulty_codes[Code::kOk] + faulty_codes[Code::kInternal] + faulty_codes[Code::kUnavailable],
      kThreadsPerDevice * kRequests)
      << "only OK, INTERNAL and UNAVAILABLE: " << codes;
  EXPECT_TRUE(Serving());
  ExpectOnlyTheFaultyDeviceOut();
}

// On GPUs: the fault on one GPU takes every GPU of the process out, each naming the GPU where
// it struck; health turns NOT_SERVING, and requests get UNAVAILABLE, not a crash or a hang.
TEST_P(NodeFaultTest, CudaStickyFaultEndsEveryGpu) {
#if !OPSERVE_TEST_HOOKS
  GTEST_SKIP() << "opserve was built without OPSERVE_TEST_HOOKS";
#endif
  if (!IsCuda()) GTEST_SKIP() << "CUDA's process-wide sticky errors; CPU devices stay apart";
  const client::HostTensor x = RandomValues(v1::FLOAT32, {48, 40}, rng_);
  ASSERT_TRUE(node().Put("x0", x, {.device = dev(0)}).ok());
  ASSERT_TRUE(node().Put("x1", x, {.device = dev(1)}).ok());
  ASSERT_TRUE(node().Execute(OneNode("row_sum", {Stored("x1")})).ok());
  EXPECT_TRUE(StatusIs(node().Execute(OneNode("row_sum", {Stored("x1")})).status(),
                       Code::kInternal));
  for (const std::string& d : devices()) {
    SCOPED_TRACE(d);
    const std::string name = d == dev(0) ? "x0" : "x1";
    if (d != dev(0) && d != dev(1)) continue;
    EXPECT_TRUE(StatusIs(node().Execute(OneNode("row_sum", {Stored(name)})).status(),
                         Code::kUnavailable, {d}));
  }
  absl::StatusOr<v1::ListOpsResponse> ops = node().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  for (const v1::DeviceInfo& d : ops->devices()) {
    EXPECT_FALSE(d.serving()) << d.name();
    if (d.name() != FaultyDevice()) {
      EXPECT_NE(d.error().find(FaultyDevice()), std::string::npos)
          << d.name() << " names the GPU where the fault struck: " << d.error();
    }
  }
  EXPECT_FALSE(Serving()) << "no device serves: health is NOT_SERVING";
}

INSTANTIATE_NODE_TEST(NodeFaultTest);
INSTANTIATE_NODE_TEST(NodeFaultUnderLoadTest);

}  // namespace
}  // namespace opserve::e2e
