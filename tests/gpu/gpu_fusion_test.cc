// The planner's fusion on the real `opserve --device=cuda`: every rule of FusionRules() at its
// test shapes, its GPU-only shapes and fresh random shapes, on every dtype its inner op takes,
// fused against the same graph with fuse=false. Skipped (not passed) where no GPU is usable.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_server_fixture.h"
#include "tests/support/fusion_cases.h"

namespace opserve::e2e {
namespace {

using GpuFusionTest = GpuServerTest;

const v1::NodeResult* Report(const v1::ExecuteResponse& r, const std::string& id) {
  for (const v1::NodeResult& n : r.nodes()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

TEST_F(GpuFusionTest, EveryRuleGivesTheUnfusedGraphsResult) {
  std::vector<test_support::FusionCase> cases = test_support::FusionCases(/*large=*/true);
  for (test_support::FusionCase& c : test_support::RandomFusionCases(rng_, 4)) cases.push_back(c);
  int fused_cases = 0;
  for (const test_support::FusionCase& c : cases) {
    SCOPED_TRACE(c.Name());
    const std::vector<std::string> inputs = test_support::FusionInputs(c, rng_);
    auto fused = client().Execute(test_support::FusionRequest(c, inputs, true));
    auto unfused = client().Execute(test_support::FusionRequest(c, inputs, false));
    ASSERT_TRUE(fused.ok()) << fused.status();
    ASSERT_TRUE(unfused.ok()) << unfused.status();
    const v1::NodeResult* inner = Report(*fused, "inner");
    const v1::NodeResult* outer = Report(*fused, "outer");
    ASSERT_TRUE(inner != nullptr && outer != nullptr);
    // A case fuses where the rule has a CUDA row for its dtype, and only there.
    if (test_support::FusesOn(c, "cuda")) {
      EXPECT_EQ(outer->algorithm(), c.rule->name);
      EXPECT_EQ(inner->algorithm(), c.rule->name);
      EXPECT_EQ(inner->fused_into(), "outer");
      EXPECT_EQ(inner->kernel_us(), outer->kernel_us());
    } else {
      EXPECT_NE(outer->algorithm(), c.rule->name);
      EXPECT_EQ(inner->fused_into(), "");
    }
    EXPECT_NE(Report(*unfused, "outer")->algorithm(), c.rule->name);
    fused_cases += outer->algorithm() == c.rule->name;
    const v1::Tensor& got = fused->outputs(0).tensor();
    const v1::Tensor& want = unfused->outputs(0).tensor();
    absl::Status same = test_support::CompareFusion(c, static_cast<DType>(got.dtype()), got.data(),
                                                    want.data(), /*bitwise=*/false);
    EXPECT_TRUE(same.ok()) << same;
  }
  std::cout << fused_cases << " of " << cases.size() << " fusion cases fused and checked\n";
}

}  // namespace
}  // namespace opserve::e2e
