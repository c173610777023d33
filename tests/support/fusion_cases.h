// The fusion rules' test cases (FusionRules(), server/ops/op.h), shared by the CPU unit test and
// the GPU suite: one case per rule, dtype the inner op takes and test shape, its request with
// fusion on or off, random inputs and the comparison of a fused output with the unfused one.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "opserve/v1/opserve.pb.h"
#include "server/ops/op.h"

namespace opserve::test_support {

struct FusionCase {
  const FusionRule* rule = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<std::vector<int64_t>> shapes;  // the inner node's inputs
  std::string Name() const;                  // a gtest-safe name
};

// Every rule x dtype of its inner op x test shape; `large` adds the GPU suite's shapes.
std::vector<FusionCase> FusionCases(bool large);

// Whether the case's pattern fuses on `backend` ("cpu", "cuda"): the rule has a row there for
// its dtype, or runs the outer op's own algorithms.
bool FusesOn(const FusionCase& c, absl::string_view backend);

// `per_rule` cases of each rule at random shapes (2-D sides up to 2500, matmul sides up to 700)
// and dtypes of its inner op.
std::vector<FusionCase> RandomFusionCases(std::mt19937_64& rng, int per_rule);

// Inline inputs "x0", "x1", ... holding `inputs`, the inner node "inner" on them, the outer node
// "outer" on it (both auto), and the outer output returned. fuse=false on both nodes unless
// `fuse`.
v1::ExecuteRequest FusionRequest(const FusionCase& c, const std::vector<std::string>& inputs,
                                 bool fuse);

// Fresh random inputs: floats in [0, 1) (BFLOAT16 rounded from them), integers in
// [-1000, 1000].
std::vector<std::string> FusionInputs(const FusionCase& c, std::mt19937_64& rng);

// OK when `got` (the fused output) matches `want` (the unfused one), both `out_dtype`: equal
// bytes when `bitwise` or for integers, else within the rule's tolerance, normwise; never NaN.
absl::Status CompareFusion(const FusionCase& c, DType out_dtype, const std::string& got,
                           const std::string& want, bool bitwise);

}  // namespace opserve::test_support
