// One server, several devices: what ListOps and ServerMetadata say about them, where PutTensor
// places a tensor (the most free budget, or the device named), what TensorInfo reports of it,
// and MoveTensor between devices.
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/e2e/node_fixture.h"

namespace opserve::e2e {
namespace {

using Code = absl::StatusCode;

// A budget every device gets, so that the free budget placement reads is known.
constexpr uint64_t kBudget = 64 * kMiB;

class NodeDevicesTest : public NodeTest {
 protected:
  std::vector<std::string> NodeFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", kBudget)};
  }
};

TEST_P(NodeDevicesTest, ListOpsAndServerMetadataListEveryDevice) {
  absl::StatusOr<v1::ListOpsResponse> ops = node().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  const std::string prefix = Device() == "cpu" ? "cpu" : "cuda";
  EXPECT_EQ(ops->backend(), prefix);
  ASSERT_EQ(ops->devices_size(), n());
  for (int i = 0; i < n(); ++i) {
    const v1::DeviceInfo& d = ops->devices(i);
    SCOPED_TRACE(d.name());
    EXPECT_EQ(d.name(), absl::StrCat(prefix, ":", i)) << "devices are listed in index order";
    EXPECT_TRUE(d.serving());
    EXPECT_EQ(d.error(), "");
    EXPECT_EQ(d.memory_budget(), kBudget) << "--memory_budget_bytes applies to each device";
    EXPECT_LE(d.memory_used(), d.memory_budget());
    EXPECT_GT(d.memory_total(), 0u);
    EXPECT_NE(d.description().find(d.name()), std::string::npos)
        << "description \"" << d.description() << "\" does not name the device";
    if (Device() == "cpu") EXPECT_EQ(d.capability(), "cpu");
    EXPECT_FALSE(d.algorithms().empty()) << "no op/algorithm rows";
  }
  EXPECT_NE(ops->device().find(ops->devices(0).name()), std::string::npos)
      << "ListOpsResponse.device \"" << ops->device() << "\" is not the first device's";

  absl::StatusOr<inference::ServerMetadataResponse> meta = node().ServerMetadata();
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->devices_size(), n());
  for (int i = 0; i < n(); ++i) {
    const inference::ServerDevice& d = meta->devices(i);
    SCOPED_TRACE(d.name());
    EXPECT_EQ(d.name(), dev(i));
    EXPECT_TRUE(d.serving());
    EXPECT_EQ(d.error(), "");
    EXPECT_EQ(d.memory_budget(), kBudget);
    EXPECT_EQ(d.description(), ops->devices(i).description());
  }
}

// Equal budgets, all free: the first put goes to the lowest index, each next one to the device
// with the most budget left, so N equal puts land on N different devices, in index order.
TEST_P(NodeDevicesTest, PutWithoutDeviceGoesWhereTheMostBudgetIsFree) {
  std::vector<client::HostTensor> put;
  for (int i = 0; i <= n(); ++i) {
    put.push_back(RandomValues(v1::FLOAT32, {256, 256}, rng_));  // 256 KiB each
    const std::string name = absl::StrCat("t", i);
    absl::StatusOr<v1::TensorInfo> info = node().Put(name, put.back());
    ASSERT_TRUE(info.ok()) << name << ": " << info.status();
    // After n puts every device holds one: equal again, so the lowest index.
    EXPECT_EQ(info->device(), dev(i % n())) << name;
    EXPECT_EQ(info->bytes(), Bytes(put.back()));
    EXPECT_EQ(info->shards_size(), 0) << "not sharded";
  }
  for (int i = 0; i <= n(); ++i) {
    const std::string name = absl::StrCat("t", i);
    absl::StatusOr<GotTensor> got = node().Get(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_EQ(got->info.device(), dev(i % n())) << name;
    EXPECT_TRUE(got->tensor.data == put[i].data) << name << ": GetTensor's bytes differ";
  }
  // memory_used: each device holds what was put there.
  for (int d = 0; d < n(); ++d) {
    const uint64_t held = Bytes(put[0]) * (d == 0 ? 2 : 1);
    EXPECT_GE(DeviceEntry(dev(d)).memory_used(), held) << dev(d);
  }
}

TEST_P(NodeDevicesTest, PutOnANamedDevice) {
  // A bigger tensor on the last device first: the named device wins over free budget.
  std::vector<client::HostTensor> put;
  for (int i = n() - 1; i >= 0; --i) {
    put.push_back(RandomValues(v1::INT32, {33, 65}, rng_));
    const std::string name = absl::StrCat("on", i);
    absl::StatusOr<v1::TensorInfo> info = node().Put(name, put.back(), {.device = dev(i)});
    ASSERT_TRUE(info.ok()) << name << ": " << info.status();
    EXPECT_EQ(info->device(), dev(i));
    EXPECT_EQ(info->name(), name);
    EXPECT_EQ(info->dtype(), v1::INT32);
    EXPECT_EQ(info->bytes(), Bytes(put.back()));
  }
  // ListTensors and GetTensor report the same device, and the bytes come back.
  absl::StatusOr<std::vector<v1::TensorInfo>> list = node().List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(static_cast<int>(list->size()), n());
  for (const v1::TensorInfo& info : *list) {
    const int i = std::stoi(info.name().substr(2));
    EXPECT_EQ(info.device(), dev(i)) << info.name();
    absl::StatusOr<GotTensor> got = node().Get(info.name());
    ASSERT_TRUE(got.ok()) << info.name() << ": " << got.status();
    EXPECT_EQ(got->info.device(), dev(i));
    EXPECT_TRUE(got->tensor.data == put[n() - 1 - i].data) << info.name();
  }
  // Overwriting on another device moves the name there.
  const client::HostTensor again = RandomValues(v1::FLOAT32, {7}, rng_);
  absl::StatusOr<v1::TensorInfo> over =
      node().Put("on0", again, {.device = dev(n() - 1), .overwrite = true});
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->device(), dev(n() - 1));
  absl::StatusOr<GotTensor> got = node().Get("on0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->info.device(), dev(n() - 1));
  EXPECT_TRUE(got->tensor.data == again.data);
}

TEST_P(NodeDevicesTest, ADeviceTheServerDoesNotServeIsInvalid) {
  const client::HostTensor t = RandomValues(v1::FLOAT32, {4, 4}, rng_);
  const std::string bare = Device() == "cpu" ? "cpu" : "cuda";  // the one-device name
  for (const std::string& device :
       {Unserved(), std::string("gpu:0"), bare, std::string("cpu:-1")}) {
    SCOPED_TRACE(device);
    EXPECT_TRUE(StatusIs(node().Put("x", t, {.device = device}).status(), Code::kInvalidArgument,
                         {device}));
    EXPECT_TRUE(StatusIs(node().Listed("x").status(), Code::kNotFound)) << "nothing is stored";
  }
  ASSERT_TRUE(node().Put("x", t, {.device = dev(0)}).ok());
  for (const std::string& device : {Unserved(), std::string("gpu:0"), bare}) {
    SCOPED_TRACE(device);
    EXPECT_TRUE(StatusIs(node().Move("x", device).status(), Code::kInvalidArgument, {device}));
    v1::ExecuteRequest r = OneNode("row_sum", {Stored("x")}, "y");
    r.mutable_outputs(0)->set_device(device);
    EXPECT_TRUE(StatusIs(node().Execute(r).status(), Code::kInvalidArgument, {device}));
    EXPECT_TRUE(StatusIs(node().Listed("y").status(), Code::kNotFound)) << "nothing is stored";
  }
  // MoveTensor has no default device: an empty one names the field.
  EXPECT_TRUE(StatusIs(node().Move("x", "").status(), Code::kInvalidArgument, {"device"}));
  absl::StatusOr<v1::TensorInfo> x = node().Listed("x");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->device(), dev(0)) << "a refused move left the tensor where it was";
  EXPECT_TRUE(Serving());
}

TEST_P(NodeDevicesTest, MoveTensorMovesItAndGraphsStillReadIt) {
  const client::HostTensor x = RandomValues(v1::FLOAT32, {129, 67}, rng_);
  ASSERT_TRUE(node().Put("x", x, {.device = dev(0)}).ok());
  const uint64_t used0 = DeviceEntry(dev(0)).memory_used();
  const uint64_t used_last = DeviceEntry(dev(n() - 1)).memory_used();

  absl::StatusOr<v1::MoveTensorResponse> moved = node().Move("x", dev(n() - 1));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->info().device(), dev(n() - 1));
  EXPECT_EQ(moved->info().name(), "x");
  EXPECT_EQ(moved->bytes(), Bytes(x)) << "bytes copied between devices";
  EXPECT_GE(moved->seconds(), 0);
  absl::StatusOr<v1::TensorInfo> listed = node().Listed("x");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->device(), dev(n() - 1));
  absl::StatusOr<GotTensor> got = node().Get("x");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->info.device(), dev(n() - 1));
  EXPECT_TRUE(got->tensor.data == x.data) << "the move changed the contents";
  // The memory went with it.
  EXPECT_LE(DeviceEntry(dev(0)).memory_used() + Bytes(x), used0);
  EXPECT_GE(DeviceEntry(dev(n() - 1)).memory_used(), used_last + Bytes(x));

  // A graph reads it where it now lives: no peer copy.
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("row_sum", {Stored("x")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device(), dev(n() - 1));
  EXPECT_EQ(r->peer_copy_bytes(), 0u);
  EXPECT_TRUE(MatchesReference("row_sum", {x}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));

  // Moving it where it is copies nothing.
  absl::StatusOr<v1::MoveTensorResponse> again = node().Move("x", dev(n() - 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->bytes(), 0u);
  EXPECT_EQ(again->info().device(), dev(n() - 1));
  // And back again.
  absl::StatusOr<v1::MoveTensorResponse> back = node().Move("x", dev(0));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->bytes(), Bytes(x));
  got = node().Get("x");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->info.device(), dev(0));
  EXPECT_TRUE(got->tensor.data == x.data);
}

TEST_P(NodeDevicesTest, MoveTensorOfAnUnknownTensorOrDevice) {
  EXPECT_TRUE(StatusIs(node().Move("nobody", dev(1)).status(), Code::kNotFound, {"'nobody'"}));
  ASSERT_TRUE(node().Put("x", RandomValues(v1::INT32, {5, 3}, rng_), {.device = dev(1)}).ok());
  EXPECT_TRUE(
      StatusIs(node().Move("x", Unserved()).status(), Code::kInvalidArgument, {Unserved()}));
  absl::StatusOr<v1::TensorInfo> x = node().Listed("x");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->device(), dev(1));
  EXPECT_TRUE(Serving());
}

INSTANTIATE_NODE_TEST(NodeDevicesTest);

}  // namespace
}  // namespace opserve::e2e
