// The test hook --test_reply_without_device (server/engine/engine.h), with which opserve-bench
// tells what gRPC and the lanes' hand-offs cost from what the device costs: Execute answers
// with every node's report and outputs of the right size, all zero, without running; a graph
// that stores an output runs as usual, since the client would look for what it stored.
#include "absl/strings/str_cat.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

class UnrunTest : public OpserveTest, public ::testing::WithParamInterface<const char*> {
 protected:
  std::vector<std::string> ExtraFlags() const override {
#if OPSERVE_TEST_HOOKS
    return {absl::StrCat("--test_reply_without_device=", GetParam())};
#else
    return {};
#endif
  }
};

TEST_P(UnrunTest, AnswersWithZerosOfTheRightShapeAndStoresRun) {
#if !OPSERVE_TEST_HOOKS
  GTEST_SKIP() << "opserve was built without OPSERVE_TEST_HOOKS";
#endif
  // Values in [1, 2): no row sums to zero, so a run result cannot pass for an unrun one.
  std::vector<float> values(6 * 7);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 1.0f + static_cast<float>(i % 7) / 8;
  ASSERT_TRUE(client().PutTensor("A", F32({6, 7}, values), false).ok());

  v1::ExecuteRequest r;
  AddNode(r, "m", "row_sum", {Stored("A")});
  AddOutput(r, "m", true);
  auto resp = client().Execute(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->nodes_size(), 1);
  EXPECT_EQ(resp->nodes(0).id(), "m");
  EXPECT_EQ(resp->nodes(0).op(), "row_sum");
  ASSERT_EQ(resp->outputs_size(), 1);
  const v1::Tensor& out = resp->outputs(0).tensor();
  ASSERT_EQ(out.shape_size(), 1);
  EXPECT_EQ(out.shape(0), 6);
  EXPECT_EQ(Floats(out.data()), std::vector<float>(6, 0.0f));

  v1::ExecuteRequest stores;
  AddNode(stores, "m", "row_sum", {Stored("A")});
  AddOutput(stores, "m", true, "sums");
  auto ran = client().Execute(stores);
  ASSERT_TRUE(ran.ok()) << ran.status();
  ASSERT_EQ(ran->outputs_size(), 1);
  const std::vector<float> sums = Floats(ran->outputs(0).tensor().data());
  ASSERT_EQ(sums.size(), 6u);
  for (float s : sums) EXPECT_GT(s, 7.0f);
  auto stored = client().GetTensor("sums");
  ASSERT_TRUE(stored.ok()) << stored.status();
}

INSTANTIATE_TEST_SUITE_P(Modes, UnrunTest, ::testing::Values("handler", "launch", "lane"));

}  // namespace
}  // namespace opserve::e2e
