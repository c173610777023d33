// The planner's fusion pass (server/engine/fuse.h) on the CPU backend, through BuildPlan and
// ExecutePlan: every rule of FusionRules() on every dtype its inner op takes and every test
// shape, fused against fuse=false (the same bits where the rule's CPU row promises them), and
// the cases where a pattern must not be fused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "server/engine/cpu_backend.h"
#include "server/engine/executor.h"
#include "server/engine/plan.h"
#include "server/rpc/convert.h"
#include "tests/support/fusion_cases.h"
#include "tests/support/request_builders.h"

namespace opserve {
namespace {

using test_support::AddInline;
using test_support::AddNode;
using test_support::AddOutput;
using test_support::FusionCase;
using test_support::Inline;
using test_support::Node;
using test_support::StatusIs;

class Engine {
 public:
  Engine() {
    limits_.max_tensor_bytes = 1ull << 30;
    limits_.max_graph_nodes = 16;
    limits_.max_message_bytes = 1ull << 30;
  }
  absl::StatusOr<Plan> Build(const v1::ExecuteRequest& req) {
    return BuildPlan(convert::GraphFromProto(req), *backend_, store_, limits_);
  }
  // Runs the request; its response as the server would send it.
  absl::StatusOr<v1::ExecuteResponse> Run(const v1::ExecuteRequest& req) {
    auto plan = Build(req);
    if (!plan.ok()) return plan.status();
    auto env = backend_->NewExecEnv();
    if (!env.ok()) return env.status();
    ExecuteResult result;
    if (absl::Status s = ExecutePlan(*plan, *backend_, **env, store_, nullptr, {}, &result); !s.ok()) {
      return s;
    }
    v1::ExecuteResponse resp;
    convert::ResultToProto(std::move(result), &resp);
    return resp;
  }

 private:
  std::unique_ptr<Backend> backend_ = MakeCpuBackend(1ull << 30);
  TensorStore store_;
  Limits limits_;
};

const v1::NodeResult& Report(const v1::ExecuteResponse& r, const std::string& id) {
  for (const v1::NodeResult& n : r.nodes()) {
    if (n.id() == id) return n;
  }
  static const v1::NodeResult kNone;
  ADD_FAILURE() << "no node " << id;
  return kNone;
}

class FusionRuleTest : public testing::TestWithParam<FusionCase> {};

TEST_P(FusionRuleTest, FusedEqualsUnfused) {
  const FusionCase& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(c.Name()));
  const std::vector<std::string> inputs = test_support::FusionInputs(c, rng);
  Engine engine;
  auto plan = engine.Build(test_support::FusionRequest(c, inputs, true));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes.size(), 2u);
  EXPECT_EQ(plan->nodes[0].fused_into, 1) << "the inner node's work moves to the outer node";
  EXPECT_EQ(plan->nodes[1].fusion, c.rule->name);

  auto fused = engine.Run(test_support::FusionRequest(c, inputs, true));
  auto unfused = engine.Run(test_support::FusionRequest(c, inputs, false));
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(unfused.ok()) << unfused.status();
  for (const char* id : {"inner", "outer"}) {
    EXPECT_EQ(Report(*fused, id).algorithm(), c.rule->name) << id;
    EXPECT_NE(Report(*unfused, id).algorithm(), c.rule->name) << id;
    EXPECT_EQ(Report(*unfused, id).fused_into(), "") << id;
  }
  EXPECT_EQ(Report(*fused, "inner").fused_into(), "outer");
  EXPECT_EQ(Report(*fused, "outer").fused_into(), "");
  EXPECT_EQ(Report(*fused, "inner").bytes(), Report(*fused, "outer").bytes());
  // The fused kernel moves less than the two nodes did.
  EXPECT_LT(Report(*fused, "outer").bytes(),
            Report(*unfused, "inner").bytes() + Report(*unfused, "outer").bytes());
  ASSERT_EQ(fused->outputs_size(), 1);
  ASSERT_EQ(unfused->outputs_size(), 1);
  const v1::Tensor& got = fused->outputs(0).tensor();
  const v1::Tensor& want = unfused->outputs(0).tensor();
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(std::vector<int64_t>(got.shape().begin(), got.shape().end()),
            std::vector<int64_t>(want.shape().begin(), want.shape().end()));
  EXPECT_TRUE(test_support::CompareFusion(c, static_cast<DType>(got.dtype()), got.data(),
                                          want.data(), c.rule->test.cpu_bitwise)
                  .ok())
      << test_support::CompareFusion(c, static_cast<DType>(got.dtype()), got.data(), want.data(),
                                     c.rule->test.cpu_bitwise);
}

INSTANTIATE_TEST_SUITE_P(Table, FusionRuleTest, testing::ValuesIn(test_support::FusionCases(false)),
                         [](const testing::TestParamInfo<FusionCase>& p) { return p.param.Name(); });

// ---- When the pattern stays two nodes ----

// row_mean(transpose(X)) of a 6 x 4 X, with `change` applied to the request.
v1::ExecuteRequest ColMean(void (*change)(v1::ExecuteRequest&)) {
  v1::ExecuteRequest req;
  AddInline(req, "x", v1::FLOAT32, {6, 4});
  AddNode(req, "t", "transpose", {Inline("x")});
  AddNode(req, "m", "row_mean", {Node("t")});
  AddOutput(req, "m", true);
  if (change != nullptr) change(req);
  return req;
}

bool Fused(const Plan& plan) {
  for (const PlanNode& n : plan.nodes) {
    if (!n.fusion.empty() || n.fused_into >= 0) return true;
  }
  return false;
}

TEST(FusionPassTest, FusesTheDefaultPattern) {
  Engine engine;
  auto plan = engine.Build(ColMean(nullptr));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(Fused(*plan));
}

TEST(FusionPassTest, KeepsAnIntermediateThatLeavesTheRequest) {
  Engine engine;
  for (auto change : {+[](v1::ExecuteRequest& r) { AddOutput(r, "t", true); },
                      +[](v1::ExecuteRequest& r) { AddOutput(r, "t", false, "kept"); }}) {
    auto plan = engine.Build(ColMean(change));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_FALSE(Fused(*plan));
  }
}

TEST(FusionPassTest, KeepsAnIntermediateThatAnotherNodeReads) {
  Engine engine;
  auto plan = engine.Build(ColMean([](v1::ExecuteRequest& r) {
    AddNode(r, "s", "row_sum", {Node("t")});
    AddOutput(r, "s", true);
  }));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(Fused(*plan));
}

TEST(FusionPassTest, KeepsNamedAlgorithmsAndFuseFalse) {
  Engine engine;
  for (auto change : {+[](v1::ExecuteRequest& r) { r.mutable_nodes(0)->set_algorithm("reference"); },
                      +[](v1::ExecuteRequest& r) { r.mutable_nodes(1)->set_algorithm("reference"); },
                      +[](v1::ExecuteRequest& r) { (*r.mutable_nodes(0)->mutable_attrs())["fuse"].set_b(false); },
                      +[](v1::ExecuteRequest& r) { (*r.mutable_nodes(1)->mutable_attrs())["fuse"].set_b(false); }}) {
    auto plan = engine.Build(ColMean(change));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_FALSE(Fused(*plan));
  }
  // fuse=true is the default, said out loud.
  auto plan = engine.Build(ColMean([](v1::ExecuteRequest& r) {
    (*r.mutable_nodes(1)->mutable_attrs())["fuse"].set_b(true);
  }));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(Fused(*plan));
}

TEST(FusionPassTest, FuseTakesABool) {
  Engine engine;
  auto plan = engine.Build(ColMean([](v1::ExecuteRequest& r) {
    (*r.mutable_nodes(1)->mutable_attrs())["fuse"].set_i(0);
  }));
  EXPECT_TRUE(StatusIs(plan.status(), absl::StatusCode::kInvalidArgument, {"'m'", "'fuse'", "bool"}));
}

TEST(FusionPassTest, TheDemoGraphFusesItsLastTwoNodes) {
  // row_mean(transpose(matmul(A, B))): the column mean of A B, after the matmul.
  Engine engine;
  v1::ExecuteRequest req;
  AddInline(req, "a", v1::FLOAT32, {5, 3});
  AddInline(req, "b", v1::FLOAT32, {3, 7});
  AddNode(req, "mm", "matmul", {Inline("a"), Inline("b")});
  AddNode(req, "t", "transpose", {Node("mm")});
  AddNode(req, "m", "row_mean", {Node("t")});
  AddOutput(req, "m", true);
  auto plan = engine.Build(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes.size(), 3u);
  EXPECT_EQ(plan->nodes[0].fused_into, -1);
  EXPECT_TRUE(plan->nodes[0].fusion.empty());
  EXPECT_EQ(plan->nodes[1].fused_into, 2);
  EXPECT_EQ(plan->nodes[2].fusion, "fused:col_mean");
  EXPECT_EQ(plan->nodes[0].last_use, 2) << "the matmul's output is read by the fused node";
  auto resp = engine.Run(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->outputs(0).tensor().shape(0), 7);
}

TEST(FusionPassTest, EmptyInputsFillAsUnfused) {
  Engine engine;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0, 5}, std::vector<int64_t>{5, 0}}) {
    v1::ExecuteRequest fused, unfused;
    for (v1::ExecuteRequest* r : {&fused, &unfused}) {
      AddInline(*r, "x", v1::FLOAT32, shape);
      AddNode(*r, "t", "transpose", {Inline("x")});
      AddNode(*r, "m", "row_mean", {Node("t")});
      AddOutput(*r, "m", true);
    }
    (*unfused.mutable_nodes(1)->mutable_attrs())["fuse"].set_b(false);
    auto a = engine.Run(fused);
    auto b = engine.Run(unfused);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->outputs(0).tensor().data(), b->outputs(0).tensor().data()) << shape[0] << "x" << shape[1];
    EXPECT_EQ(a->outputs(0).tensor().data().size(), static_cast<size_t>(shape[1]) * 4);
  }
}

}  // namespace
}  // namespace opserve
