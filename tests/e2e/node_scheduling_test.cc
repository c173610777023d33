// Where a graph runs on a server of several devices: inline-only graphs on the least-loaded
// device (back to back they take turns; many at once use every device), graphs over stored
// tensors on the device that holds most of their input bytes, with the rest copied there and
// counted (ExecuteResponse.peer_copy_bytes, RequestTiming.peer_copy_us), and store_as keeping an
// output where it ran or on the device OutputSpec.device names.
#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/node_fixture.h"

namespace opserve::e2e {
namespace {

using NodeSchedulingTest = NodeTest;

// Ties (nothing queued anywhere) go round-robin: any n() requests in a row ran on n() devices.
TEST_P(NodeSchedulingTest, BackToBackInlineRequestsTakeTurns) {
  const client::HostTensor x = RandomValues(v1::FLOAT32, {32, 48}, rng_);
  std::vector<std::string> ran;
  for (int i = 0; i < 4 * n(); ++i) {
    v1::ExecuteRequest r;
    AddInline(r, "x", x);
    AddNode(r, "s", "row_sum", {Inline("x")});
    AddOutput(r, "s", true);
    absl::StatusOr<v1::ExecuteResponse> resp = node().Execute(r);
    ASSERT_TRUE(resp.ok()) << "request " << i << ": " << resp.status();
    EXPECT_TRUE(
        MatchesReference("row_sum", {x}, Output(*resp, "s"), NodeReport(*resp, "s").algorithm()));
    EXPECT_EQ(resp->peer_copy_bytes(), 0u) << "inline inputs are no peer copy";
    ran.push_back(resp->device());
  }
  for (size_t i = 0; i + n() <= ran.size(); ++i) {
    const std::set<std::string> window(ran.begin() + i, ran.begin() + i + n());
    EXPECT_EQ(static_cast<int>(window.size()), n())
        << "requests " << i << ".." << i + n() - 1 << " ran on " << Joined(ran)
        << ": back-to-back requests should alternate over " << Joined(devices());
  }
  for (const std::string& d : ran) {
    EXPECT_TRUE(std::count(devices().begin(), devices().end(), d)) << "ran on \"" << d << "\"";
  }
}

TEST_P(NodeSchedulingTest, ConcurrentInlineRequestsUseEveryDevice) {
  // Matmuls big enough to be queued or running while the others arrive.
  constexpr int64_t kSide = 160;
  const client::HostTensor a = RandomValues(v1::FLOAT32, {kSide, kSide}, rng_);
  const client::HostTensor b = RandomValues(v1::FLOAT32, {kSide, kSide}, rng_);
  v1::ExecuteRequest r;
  AddInline(r, "a", a);
  AddInline(r, "b", b);
  AddNode(r, "mm", "matmul", {Inline("a"), Inline("b")});
  AddOutput(r, "mm", true);
  const int threads = 4 * n(), per_thread = 3;
  std::mutex mu;
  std::map<std::string, int> ran;
  std::vector<std::string> failures;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      NodeClient c(server().target());
      for (int i = 0; i < per_thread; ++i) {
        absl::StatusOr<v1::ExecuteResponse> resp = c.Execute(r);
        std::lock_guard<std::mutex> lock(mu);
        if (!resp.ok()) {
          failures.push_back(
              absl::StrCat("thread ", t, " request ", i, ": ", resp.status().ToString()));
          continue;
        }
        ++ran[resp->device()];
        if (::testing::AssertionResult m = MatchesReference("matmul", {a, b}, Output(*resp, "mm"),
                                                            NodeReport(*resp, "mm").algorithm());
            !m) {
          failures.push_back(absl::StrCat("on ", resp->device(), ": ", m.message()));
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, the first: " << failures[0];
  std::string counts;
  for (const auto& [d, k] : ran) absl::StrAppend(&counts, d, ": ", k, "; ");
  for (const std::string& d : devices()) {
    EXPECT_GT(ran[d], 0) << d << " ran none of " << threads * per_thread << " concurrent requests ("
                         << counts << ")";
  }
  EXPECT_EQ(ran.size(), devices().size()) << "devices that are not the server's: " << counts;
}

// matmul(A on one device, B on another) for the two ways round and for each float dtype: it runs
// where more of its input bytes are, the other input is copied there and counted, and the
// answer is the reference's.
TEST_P(NodeSchedulingTest, CrossDeviceMatmulRunsWhereMostInputBytesAre) {
  const int other = n() - 1;
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    for (bool a_bigger : {true, false}) {
      SCOPED_TRACE(absl::StrCat(client::DTypeName(dtype), a_bigger ? ", A bigger" : ", B bigger"));
      // A [M, K] on device 0, B [K, N] on the last device; the bigger holds 4x the bytes.
      const int64_t k = 96;
      const int64_t m = a_bigger ? 384 : 96, cols = a_bigger ? 96 : 384;
      const client::HostTensor a = RandomValues(dtype, {m, k}, rng_);
      const client::HostTensor b = RandomValues(dtype, {k, cols}, rng_);
      ASSERT_TRUE(node().Put("A", a, {.device = dev(0), .overwrite = true}).ok());
      ASSERT_TRUE(node().Put("B", b, {.device = dev(other), .overwrite = true}).ok());
      absl::StatusOr<v1::ExecuteResponse> r =
          node().Execute(OneNode("matmul", {Stored("A"), Stored("B")}));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->device(), a_bigger ? dev(0) : dev(other));
      EXPECT_EQ(r->peer_copy_bytes(), a_bigger ? Bytes(b) : Bytes(a))
          << "the smaller input is the one that moves";
      EXPECT_GT(r->timing().peer_copy_us(), 0);
      if (IsCuda()) {  // beside the GEMM, which starts on B's first block of columns
        EXPECT_LE(r->timing().peer_copy_us(), r->timing().total_us())
            << "the copy runs within the request";
      } else {
        EXPECT_LE(r->timing().peer_copy_us(), r->timing().input_us() + 1)
            << "copies between CPU devices finish before the run: part of input_us";
      }
      EXPECT_TRUE(
          MatchesReference("matmul", {a, b}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
      // The inputs stay where they were put.
      EXPECT_EQ(DeviceOf("A"), dev(0));
      EXPECT_EQ(DeviceOf("B"), dev(other));
    }
  }
}

TEST_P(NodeSchedulingTest, InputsOnOneDeviceNeedNoPeerCopy) {
  const client::HostTensor a = RandomValues(v1::FLOAT32, {65, 33}, rng_);
  const client::HostTensor b = RandomValues(v1::FLOAT32, {33, 17}, rng_);
  ASSERT_TRUE(node().Put("A", a, {.device = dev(1)}).ok());
  ASSERT_TRUE(node().Put("B", b, {.device = dev(1)}).ok());
  // An inline input beside them does not pull the graph elsewhere.
  const client::HostTensor c = RandomValues(v1::FLOAT32, {17, 5}, rng_);
  v1::ExecuteRequest req;
  AddInline(req, "C", c);
  AddNode(req, "ab", "matmul", {Stored("A"), Stored("B")});
  AddNode(req, "abc", "matmul", {Node("ab"), Inline("C")});
  AddOutput(req, "ab", true);
  AddOutput(req, "abc", true);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::ExecuteResponse> r = node().Execute(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->device(), dev(1)) << "request " << i;
    EXPECT_EQ(r->peer_copy_bytes(), 0u);
    EXPECT_EQ(r->timing().peer_copy_us(), 0);
    EXPECT_TRUE(
        MatchesReference("matmul", {a, b}, Output(*r, "ab"), NodeReport(*r, "ab").algorithm()));
  }
}

TEST_P(NodeSchedulingTest, StoreAsKeepsTheOutputWhereItRanOrWhereOutputSpecSays) {
  const client::HostTensor x = RandomValues(v1::FLOAT32, {40, 24}, rng_);
  ASSERT_TRUE(node().Put("x", x, {.device = dev(1)}).ok());
  // No OutputSpec.device: where the node ran.
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("transpose", {Stored("x")}, "xt"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device(), dev(1));
  ASSERT_EQ(r->stored_size(), 1);
  EXPECT_EQ(r->stored(0).device(), dev(1));
  // Each other device by name, including one the graph did not run on.
  for (int d = 0; d < n(); ++d) {
    SCOPED_TRACE(dev(d));
    const std::string name = absl::StrCat("xt", d);
    v1::ExecuteRequest req = OneNode("transpose", {Stored("x")}, name);
    req.mutable_outputs(0)->set_device(dev(d));
    r = node().Execute(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->device(), dev(1)) << "it runs where its input is";
    ASSERT_EQ(r->stored_size(), 1);
    EXPECT_EQ(r->stored(0).name(), name);
    EXPECT_EQ(r->stored(0).device(), dev(d));
    absl::StatusOr<GotTensor> got = node().Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->info.device(), dev(d));
    absl::StatusOr<client::HostTensor> returned = client::FromProto(Output(*r, "n"));
    ASSERT_TRUE(returned.ok()) << returned.status();
    EXPECT_TRUE(got->tensor.data == returned->data) << "stored and returned outputs differ";
    EXPECT_TRUE(MatchesReference("transpose", {x}, got->tensor, "reference"));
    // The stored output feeds a graph that runs where it now lives.
    absl::StatusOr<v1::ExecuteResponse> again = node().Execute(OneNode("row_max", {Stored(name)}));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->device(), dev(d));
    EXPECT_TRUE(MatchesReference("row_max", {got->tensor}, Output(*again, "n"), "reference"));
  }
}

INSTANTIATE_NODE_TEST(NodeSchedulingTest);

}  // namespace
}  // namespace opserve::e2e
