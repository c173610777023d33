// Tenants (--auth_tokens_file) over several devices: the namespace is per tenant whatever device
// a tensor lives on, so the same name in two tenants may sit on two devices, and no call of one
// tenant (reads, moves, graphs, listings) reaches the other's tensors on any device.
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/e2e/node_fixture.h"

namespace opserve::e2e {
namespace {

using Code = absl::StatusCode;

constexpr char kAlice[] = "tok-alice-node-0123456789";
constexpr char kBob[] = "tok-bob-node-9876543210";

// The token file, written once per process.
const std::string& TokenFile() {
  static const std::string* const path = [] {
    auto* p = new std::string(absl::StrCat(::testing::TempDir(), "node_tokens_", getpid(), ".txt"));
    std::ofstream out(*p);
    out << "alice:" << kAlice << "\n"
        << "bob:" << kBob << "\n";
    return p;
  }();
  return *path;
}

class NodeTenantTest : public NodeTest {
 protected:
  std::vector<std::string> NodeFlags() const override {
    return {"--auth_tokens_file=" + TokenFile()};
  }
  std::string Token() const override { return kAlice; }
  void SetUp() override {
    NodeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    alice_ = Connect(kAlice);
    bob_ = Connect(kBob);
  }
  std::unique_ptr<NodeClient> alice_, bob_;
};

TEST_P(NodeTenantTest, TheSameNameInTwoTenantsOnTwoDevices) {
  const client::HostTensor a = RandomValues(v1::FLOAT32, {17, 9}, rng_);
  const client::HostTensor b = RandomValues(v1::FLOAT32, {17, 9}, rng_);
  absl::StatusOr<v1::TensorInfo> ai = alice_->Put("w", a, {.device = dev(0)});
  ASSERT_TRUE(ai.ok()) << ai.status();
  absl::StatusOr<v1::TensorInfo> bi = bob_->Put("w", b, {.device = dev(1)});
  ASSERT_TRUE(bi.ok()) << "bob's 'w' beside alice's: " << bi.status();
  EXPECT_EQ(ai->device(), dev(0));
  EXPECT_EQ(bi->device(), dev(1));

  for (auto [who, c, t, d] :
       {std::tuple{"alice", alice_.get(), &a, 0}, std::tuple{"bob", bob_.get(), &b, 1}}) {
    SCOPED_TRACE(who);
    absl::StatusOr<GotTensor> got = c->Get("w");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->info.device(), dev(d));
    EXPECT_TRUE(got->tensor.data == t->data) << "another tenant's bytes";
    absl::StatusOr<std::vector<v1::TensorInfo>> list = c->List();
    ASSERT_TRUE(list.ok()) << list.status();
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().device(), dev(d));
    absl::StatusOr<v1::ExecuteResponse> r = c->Execute(OneNode("row_sum", {Stored("w")}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->device(), dev(d)) << "the graph runs where this tenant's 'w' is";
    EXPECT_TRUE(
        MatchesReference("row_sum", {*t}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
  }

  // Bob moves his 'w' onto alice's device: two tensors named 'w' on one device, apart.
  absl::StatusOr<v1::MoveTensorResponse> moved = bob_->Move("w", dev(0));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->bytes(), Bytes(b));
  absl::StatusOr<GotTensor> ag = alice_->Get("w"), bg = bob_->Get("w");
  ASSERT_TRUE(ag.ok() && bg.ok()) << ag.status() << " " << bg.status();
  EXPECT_TRUE(ag->tensor.data == a.data) << "bob's move touched alice's 'w'";
  EXPECT_TRUE(bg->tensor.data == b.data);
  EXPECT_EQ(ag->info.device(), dev(0));
  EXPECT_EQ(bg->info.device(), dev(0));
  // Deleting one leaves the other.
  ASSERT_TRUE(alice_->Delete("w").ok());
  bg = bob_->Get("w");
  ASSERT_TRUE(bg.ok()) << "alice's delete took bob's 'w': " << bg.status();
  EXPECT_TRUE(bg->tensor.data == b.data);
}

TEST_P(NodeTenantTest, ATenantReachesNoneOfAnothersTensorsOnAnyDevice) {
  const client::HostTensor secret = RandomValues(v1::INT32, {11, 6}, rng_);
  ASSERT_TRUE(alice_->Put("secret", secret, {.device = dev(1)}).ok());
  ASSERT_TRUE(
      alice_->Put("rows", RandomValues(v1::FLOAT32, {2L * n() + 1, 4}, rng_), {.shard = true})
          .ok());
  for (const std::string name : {"secret", "rows"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(StatusIs(bob_->Get(name).status(), Code::kNotFound, {name}));
    EXPECT_TRUE(StatusIs(bob_->Move(name, dev(0)).status(), Code::kNotFound, {name}));
    EXPECT_TRUE(StatusIs(bob_->Execute(OneNode("row_sum", {Stored(name)})).status(),
                         Code::kNotFound, {name}));
    EXPECT_TRUE(StatusIs(bob_->Delete(name).status(), Code::kNotFound, {name}));
  }
  absl::StatusOr<std::vector<v1::TensorInfo>> bobs = bob_->List();
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_TRUE(bobs->empty()) << "bob lists '" << bobs->front().name() << "'";

  // Bob's own 'secret', stored by a graph onto the device alice's is on.
  const client::HostTensor mine = RandomValues(v1::INT32, {11, 6}, rng_);
  v1::ExecuteRequest req;
  AddInline(req, "m", mine);
  AddNode(req, "t", "transpose", {Inline("m")});
  AddNode(req, "tt", "transpose", {Node("t")});
  AddOutput(req, "tt", false, "secret");
  req.mutable_outputs(0)->set_device(dev(1));
  absl::StatusOr<v1::ExecuteResponse> r = bob_->Execute(req);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<GotTensor> bg = bob_->Get("secret"), ag = alice_->Get("secret");
  ASSERT_TRUE(bg.ok() && ag.ok()) << bg.status() << " " << ag.status();
  EXPECT_EQ(bg->info.device(), dev(1));
  EXPECT_TRUE(bg->tensor.data == mine.data);
  EXPECT_TRUE(ag->tensor.data == secret.data) << "bob's store_as replaced alice's 'secret'";

  // No token: no tenant, no call.
  NodeClient anonymous(server().target());
  EXPECT_TRUE(StatusIs(anonymous.Get("secret").status(), Code::kUnauthenticated));
  EXPECT_TRUE(StatusIs(anonymous.Move("secret", dev(0)).status(), Code::kUnauthenticated));
  EXPECT_TRUE(
      StatusIs(anonymous.Put("x", mine, {.device = dev(0)}).status(), Code::kUnauthenticated));
}

INSTANTIATE_NODE_TEST(NodeTenantTest);

}  // namespace
}  // namespace opserve::e2e
