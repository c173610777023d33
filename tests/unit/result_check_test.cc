// tests/support/result_check: the one measure the GPU suite and the soak hold results to. The
// GPU suite cannot run without a GPU, so its measure is checked here, on the CPU: a wrong answer
// must fail it, a right one pass, and every op's test model must be complete enough to use.
#include "tests/support/result_check.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "server/ops/op.h"

namespace opserve {
namespace {

// RelativeError of `op` on FLOAT32 inputs (one vector of values per input).
absl::StatusOr<double> ErrorOf(absl::string_view op, std::vector<TensorMeta> metas,
                               const std::vector<std::vector<float>>& inputs,
                               const TensorMeta& out, const std::vector<float>& got,
                               const std::vector<float>& ref) {
  std::vector<const void*> pointers;
  for (const auto& in : inputs) pointers.push_back(in.data());
  return RelativeError({.op = *FindOp(op),
                        .input_meta = metas,
                        .inputs = pointers,
                        .output_meta = out,
                        .got = got.data(),
                        .reference = ref.data()});
}

TEST(ResultCheck, ReductionsScaleByTheMagnitudeSummed) {
  // sum(1, -1) = 0: an absolute error of 1e-6 is 5e-7 of sum |x|, not infinitely far from 0.
  const TensorMeta in{DType::kFloat32, {2}}, out{DType::kFloat32, {}};
  absl::StatusOr<double> err = ErrorOf("sum", {in}, {{1.f, -1.f}}, out, {1e-6f}, {0.f});
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_NEAR(*err, 5e-7, 1e-12);
}

TEST(ResultCheck, AMeanScalesByTheMeanMagnitude) {
  // row_mean of [1, 3] is 2 over a mean |x| of 2: 2.0002 is 1e-4 off, over the 5e-5 bound.
  const TensorMeta in{DType::kFloat32, {1, 2}}, out{DType::kFloat32, {1}};
  absl::StatusOr<double> err = ErrorOf("row_mean", {in}, {{1.f, 3.f}}, out, {2.0002f}, {2.f});
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_NEAR(*err, 1e-4, 1e-6);
  EXPECT_GT(*err, FindOp("row_mean")->test.tolerance("reference", DType::kFloat32));
}

TEST(ResultCheck, MatmulIsComponentwise) {
  // [1, 1] x [1, 1] = 1e-3 * 1e-3: a result of 2e-6 is off by 1e-6 over |a||b| = 1e-6.
  const TensorMeta a{DType::kFloat32, {1, 1}}, out{DType::kFloat32, {1, 1}};
  absl::StatusOr<double> err =
      ErrorOf("matmul", {a, a}, {{1e-3f}, {1e-3f}}, out, {2e-6f}, {1e-6f});
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_NEAR(*err, 1.0, 1e-3);
}

TEST(ResultCheck, NaNNeverPasses) {
  const TensorMeta in{DType::kFloat32, {1, 2}};
  const std::vector<float> nan(2, std::nanf("")), one(2, 1.f);
  EXPECT_FALSE(ErrorOf("transpose", {in}, {one}, {DType::kFloat32, {2, 1}}, nan, one).ok());
  EXPECT_FALSE(ErrorOf("row_sum", {in}, {one}, {DType::kFloat32, {1}}, nan, one).ok());
}

TEST(ResultCheck, OtherDtypesMustMatchBitForBit) {
  const TensorMeta in{DType::kInt64, {3}}, out{DType::kInt64, {}};
  const std::vector<int64_t> x = {1, 2, 3};
  const int64_t ref = 6, wrong = 7;
  const void* pointers[] = {x.data()};
  const OpResult result{.op = *FindOp("sum"),
                        .input_meta = {&in, 1},
                        .inputs = pointers,
                        .output_meta = out,
                        .got = &wrong,
                        .reference = &ref};
  EXPECT_FALSE(RelativeError(result).ok());
  EXPECT_FALSE(CheckResult(result, "reference").ok());
  const OpResult same{.op = result.op,
                      .input_meta = result.input_meta,
                      .inputs = pointers,
                      .output_meta = out,
                      .got = &ref,
                      .reference = &ref};
  EXPECT_TRUE(CheckResult(same, "reference").ok());
}

// max / min (ErrorScale::kExact) are checked bit for bit, FLOAT32 too: the canonical NaN where the
// reference has it passes, any other NaN (the poison, a payload) or the other zero fails.
TEST(ResultCheck, ExactReductionsMatchBitForBit) {
  const TensorMeta in{DType::kFloat32, {3}}, out{DType::kFloat32, {}};
  const std::vector<float> x = {1.f, 2.f, 3.f};
  auto error = [&](uint32_t got, uint32_t ref) {
    const float g = std::bit_cast<float>(got), r = std::bit_cast<float>(ref);
    return ErrorOf("max", {in}, {x}, out, {g}, {r});
  };
  ASSERT_EQ(FindOp("max")->test.error_scale, ErrorScale::kExact);
  absl::StatusOr<double> same = error(0x7FFFFFFFu, 0x7FFFFFFFu);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, 0.0);
  EXPECT_FALSE(error(0x7FC00000u, 0x7FFFFFFFu).ok()) << "a NaN of other bits";
  EXPECT_FALSE(error(0xFFFFFFFFu, 0x7FFFFFFFu).ok()) << "the poison";
  EXPECT_FALSE(error(0x80000000u, 0x00000000u).ok()) << "-0.0 for +0.0";
  EXPECT_FALSE(error(std::bit_cast<uint32_t>(3.0f), std::bit_cast<uint32_t>(2.9999998f)).ok());
  EXPECT_EQ(FindOp("max")->test.tolerance("vectorized", DType::kFloat32), 0.0);
}

// The suites that read the test models (GPU, soak) trust them: every op has a tolerance, and
// every case it lists is one its shape rule accepts.
TEST(ResultCheck, EveryOpHasAUsableTestModel) {
  for (const OpSpec& op : Ops()) {
    ASSERT_NE(op.test.tolerance, nullptr) << op.name;
    EXPECT_FALSE(op.test.edge_shapes.empty()) << op.name;
    EXPECT_FALSE(op.test.small_shapes.empty()) << op.name << ": the soak draws from these";
    const TestModel& m = op.test;
    for (const auto* cases : {&m.edge_shapes, &m.large_shapes, &m.small_shapes}) {
      for (const auto& c : *cases) {
        std::vector<TensorMeta> metas;
        for (const auto& s : c) metas.push_back({op.dtypes[0], s});
        EXPECT_EQ(static_cast<int>(c.size()), op.arity) << op.name;
        EXPECT_TRUE(op.infer(metas).ok()) << op.name << ": " << op.infer(metas).status();
      }
    }
  }
}

}  // namespace
}  // namespace opserve
