// The toy op (toy_op.cc) is in the server under test and in this process's table, and runs: the
// contract tests built into this binary then cover it as they cover every op. Without this, a
// registration that never happened would leave them passing over the built-in ops alone.
#include <algorithm>

#include "server/ops/op.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

class ToyOpTest : public OpserveTest {};

TEST_F(ToyOpTest, TheServerAndTheTableHoldTheToyOp) {
  ASSERT_NE(FindOp("toy_negate"), nullptr) << "the toy op did not register";
  absl::StatusOr<v1::ListOpsResponse> ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_TRUE(std::any_of(ops->ops().begin(), ops->ops().end(),
                          [](const v1::OpInfo& op) { return op.name() == "toy_negate"; }))
      << "the server does not list the toy op";
  v1::ExecuteRequest req;
  AddInline(req, "x", F32({3}, {1.5f, -2.f, 0.f}));
  AddNode(req, "n", "toy_negate", {Inline("x")});
  AddOutput(req, "n", true);
  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(Floats(resp->outputs(0).tensor().data()), (std::vector<float>{-1.5f, 2.f, -0.f}));
}

}  // namespace
}  // namespace opserve::e2e
