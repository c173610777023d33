// A tensor bigger than one device's budget (--memory_budget_bytes applies to each device): stored
// sharded, reduced and multiplied shard by shard, read back whole; refused unsharded, and refused
// wherever it would have to be gathered onto one device, with messages that say why.
#include "absl/strings/str_cat.h"
#include "tests/e2e/node_fixture.h"

namespace opserve::e2e {
namespace {

using Code = absl::StatusCode;

constexpr uint64_t kBudget = 8 * kMiB;
// FLOAT32 [3072, 1024]: 12 MiB, one and a half budgets.
constexpr int64_t kRows = 3072, kCols = 1024;

class NodeBudgetTest : public NodeTest {
 protected:
  std::vector<std::string> NodeFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", kBudget)};
  }
};

TEST_P(NodeBudgetTest, AShardedTensorOverOneBudgetIsStoredReducedAndReadBack) {
  const client::HostTensor big = RandomValues(v1::FLOAT32, {kRows, kCols}, rng_);
  ASSERT_GT(Bytes(big), kBudget);
  absl::StatusOr<v1::TensorInfo> info = node().Put("big", big, {.shard = true});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(ShardedAs(*info, kRows, kCols * 4, devices()));
  for (const std::string& d : devices()) {
    const v1::DeviceInfo entry = DeviceEntry(d);
    EXPECT_LE(entry.memory_used(), entry.memory_budget()) << d;
  }

  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("row_sum", {Stored("big")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device(), Joined(devices()));
  EXPECT_TRUE(MatchesReference("row_sum", {big}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
  r = node().Execute(OneNode("sum", {Stored("big")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(MatchesReference("sum", {big}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));

  // C = big x B: B goes to every device, C stays sharded.
  const client::HostTensor b = RandomValues(v1::FLOAT32, {kCols, 8}, rng_);
  ASSERT_TRUE(node().Put("B", b, {.device = dev(0)}).ok());
  r = node().Execute(OneNode("matmul", {Stored("big"), Stored("B")}, "C"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(
      MatchesReference("matmul", {big, b}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
  ASSERT_EQ(r->stored_size(), 1);
  EXPECT_TRUE(ShardedAs(r->stored(0), kRows, 8 * 4, devices()));

  absl::StatusOr<GotTensor> got = node().Get("big");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensor.shape, big.shape);
  EXPECT_TRUE(got->tensor.data == big.data) << "the whole tensor read back differs";
}

TEST_P(NodeBudgetTest, UnshardedItDoesNotFit) {
  std::vector<uint64_t> used;
  for (const std::string& d : devices()) used.push_back(DeviceEntry(d).memory_used());
  const client::HostTensor big = RandomValues(v1::FLOAT32, {kRows, kCols}, rng_);
  EXPECT_TRUE(StatusIs(node().Put("big", big).status(), Code::kResourceExhausted, {"budget"}));
  EXPECT_TRUE(StatusIs(node().Put("big", big, {.device = dev(1)}).status(),
                       Code::kResourceExhausted, {"budget"}));
  EXPECT_TRUE(StatusIs(node().Listed("big").status(), Code::kNotFound)) << "nothing is stored";
  for (int d = 0; d < n(); ++d) {
    EXPECT_EQ(DeviceEntry(dev(d)).memory_used(), used[d])
        << dev(d) << " kept memory of a refused put";
  }
  EXPECT_TRUE(Serving());
}

// Whatever must gather the shards onto one device needs the whole tensor there: over the budget.
TEST_P(NodeBudgetTest, GatheringItIsRefusedNamingTheOpTheNodeAndTheTensor) {
  const client::HostTensor big = RandomValues(v1::FLOAT32, {kRows, kCols}, rng_);
  ASSERT_TRUE(node().Put("big", big, {.shard = true}).ok());
  const StoreSnapshot before = Snapshot(client());

  v1::ExecuteRequest flip;
  AddNode(flip, "flip", "transpose", {Stored("big")});
  AddOutput(flip, "flip", /*return_inline=*/false, /*store_as=*/"flipped");
  EXPECT_TRUE(StatusIs(node().Execute(flip).status(), Code::kResourceExhausted,
                       {"transpose", "flip", "big"}));
  EXPECT_TRUE(StatusIs(node().Move("big", dev(0)).status(), Code::kResourceExhausted, {"big"}));

  EXPECT_TRUE(SameStore(before, Snapshot(client()))) << "a refused request changed the store";
  absl::StatusOr<v1::TensorInfo> info = node().Listed("big");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(ShardedAs(*info, kRows, kCols * 4, devices())) << "still sharded";
  // And still usable.
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("row_max", {Stored("big")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(MatchesReference("row_max", {big}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
  EXPECT_TRUE(Serving());
}

INSTANTIATE_NODE_TEST(NodeBudgetTest);

}  // namespace
}  // namespace opserve::e2e
