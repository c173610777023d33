// CheckMeta and MetaFromProto: the one gate every client-supplied dtype and shape passes
// (PutTensor headers, inline tensors, node outputs). Rank 0..4, every dimension >= 0 (a zero
// makes an empty tensor), a known dtype, and a byte count that neither overflows 64 bits nor
// exceeds the limit.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/plan.h"
#include "server/ops/tensor.h"

namespace opserve {
namespace {

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// A shape as the wire carries it: CheckedMeta reads a span of the request's dimensions.
std::vector<int64_t> Shape(std::vector<int64_t> dims) { return dims; }

bool Mentions(const absl::Status& s, absl::string_view fragment) {
  return s.message().find(fragment) != absl::string_view::npos;
}

TEST(CheckMeta, AcceptsRanksZeroToFourOfEveryDtype) {
  for (DType d : {DType::kFloat32, DType::kInt32, DType::kInt64, DType::kBFloat16}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {1}, {7, 3}, {2, 3, 4}, {2, 3, 4, 5}}) {
      TensorMeta m{d, shape};
      EXPECT_TRUE(CheckMeta(m, kNoLimit, "t").ok()) << m.DebugString();
    }
  }
}

TEST(CheckMeta, ElementSizesAndBytes) {
  EXPECT_EQ((TensorMeta{DType::kFloat32, {2, 3}}).Bytes(), 24u);
  EXPECT_EQ((TensorMeta{DType::kInt32, {5}}).Bytes(), 20u);
  EXPECT_EQ((TensorMeta{DType::kInt64, {5}}).Bytes(), 40u);
  EXPECT_EQ((TensorMeta{DType::kBFloat16, {3, 3}}).Bytes(), 18u);
  EXPECT_EQ((TensorMeta{DType::kFloat32, {}}).Bytes(), 4u);  // a scalar is one element
  EXPECT_EQ((TensorMeta{DType::kFloat32, {}}).NumElements(), 1);
}

TEST(CheckMeta, RankAboveFour) {
  absl::Status s = CheckMeta({DType::kFloat32, {1, 2, 3, 4, 5}}, kNoLimit, "tensor 'r5'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Mentions(s, "tensor 'r5'")) << s;
  EXPECT_TRUE(Mentions(s, "0..4")) << s;
  EXPECT_TRUE(Mentions(s, "got 5")) << s;
}

// numpy's empty arrays: zero-length dimensions make a tensor of no bytes, at any position.
TEST(CheckMeta, ZeroDimensionsMakeEmptyTensors) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{0}, {3, 0}, {0, 3}, {2, 0, 5}, {0, int64_t{1} << 62, 4}}) {
    const TensorMeta meta{DType::kFloat32, shape};
    EXPECT_TRUE(CheckMeta(meta, kNoLimit, "tensor 'z'").ok()) << ShapeString(shape);
    EXPECT_EQ(meta.NumElements(), 0) << ShapeString(shape);
    EXPECT_EQ(meta.Bytes(), 0u) << ShapeString(shape);
  }
  // Empty fits any byte limit.
  EXPECT_TRUE(CheckMeta({DType::kInt64, {0, 7}}, 0, "tensor 'z'").ok());
}

TEST(CheckMeta, ZeroDoesNotHideANegativeDimension) {
  absl::Status s = CheckMeta({DType::kFloat32, {0, -3}}, kNoLimit, "tensor 'z'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Mentions(s, "tensor 'z'")) << s;
  EXPECT_TRUE(Mentions(s, "dimension 1")) << s;
  EXPECT_TRUE(Mentions(s, ">= 0, got -3")) << s;
}

TEST(CheckMeta, NegativeDimension) {
  absl::Status s = CheckMeta({DType::kInt32, {-1}}, kNoLimit, "tensor 'n'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Mentions(s, "got -1")) << s;
}

TEST(CheckMeta, TwoNegativesDoNotMakeAPositive) {
  absl::Status s = CheckMeta({DType::kInt32, {-2, -2}}, kNoLimit, "tensor 'n'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(CheckMeta, InvalidDtype) {
  absl::Status s = CheckMeta({DType::kInvalid, {2}}, kNoLimit, "tensor 'd'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Mentions(s, "tensor 'd'")) << s;
  EXPECT_TRUE(Mentions(s, "FLOAT32")) << s;
  EXPECT_TRUE(Mentions(s, "got DTYPE_UNSPECIFIED (0)")) << s;
}

// A value outside the enum (a newer client's dtype) is refused by its number, and never passes
// as a dtype of zero-byte elements.
TEST(CheckMeta, DtypeOutsideTheEnum) {
  for (int value : {5, 99, -1}) {
    absl::Status s = CheckMeta({static_cast<DType>(value), {2}}, kNoLimit, "tensor 'd'");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << value << ": " << s;
    EXPECT_TRUE(Mentions(s, absl::StrCat("got ", value))) << s;
  }
}

// A hostile shape whose byte count wraps around 2^64 to something small must not pass.
TEST(CheckMeta, OverflowingShapesAreRejected) {
  const std::vector<TensorMeta> hostile = {
      {DType::kFloat32, {int64_t{1} << 32, int64_t{1} << 32}},  // 2^64 elements: wraps to 0
      {DType::kFloat32, {int64_t{1} << 62}},                    // 2^64 bytes: wraps to 0
      {DType::kInt64, {int64_t{1} << 61}},                      // 2^64 bytes
      {DType::kBFloat16, {kI64Max, kI64Max}},
      {DType::kInt32, {kI64Max}},
      {DType::kInt32, {65536, 65536, 65536, 65536}},  // 2^64 elements, 2^66 bytes
      {DType::kFloat32, {3, int64_t{1} << 62, 1, 1}},
  };
  for (const TensorMeta& m : hostile) {
    absl::Status s = CheckMeta(m, kNoLimit, "tensor 'h'");
    EXPECT_FALSE(s.ok()) << m.DebugString() << " passed";
    EXPECT_TRUE(s.code() == absl::StatusCode::kResourceExhausted ||
                s.code() == absl::StatusCode::kInvalidArgument)
        << s;
    EXPECT_TRUE(Mentions(s, "tensor 'h'")) << s;
    EXPECT_TRUE(Mentions(s, ShapeString(m.shape))) << s;
  }
}

TEST(CheckMeta, LargestShapeThatFitsIn64Bits) {
  // (2^61 - 1) * 8 = 2^64 - 8 bytes: representable, so only a limit can refuse it.
  EXPECT_TRUE(CheckMeta({DType::kInt64, {(int64_t{1} << 61) - 1}}, kNoLimit, "t").ok());
}

TEST(CheckMeta, MaxBytesIsInclusive) {
  EXPECT_TRUE(CheckMeta({DType::kFloat32, {256}}, 1024, "t").ok());
  absl::Status s = CheckMeta({DType::kFloat32, {257}}, 1024, "tensor 'big'");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(Mentions(s, "tensor 'big'")) << s;
  EXPECT_TRUE(Mentions(s, "1028")) << s;
  EXPECT_TRUE(Mentions(s, "1024")) << s;
}

TEST(CheckedMeta, ConvertsAValidHeader) {
  absl::StatusOr<TensorMeta> m = CheckedMeta(int(DType::kBFloat16), Shape({3, 4}), kNoLimit, "t");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, (TensorMeta{DType::kBFloat16, {3, 4}}));
  absl::StatusOr<TensorMeta> scalar = CheckedMeta(int(DType::kInt64), Shape({}), kNoLimit, "t");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->rank(), 0);
}

TEST(CheckedMeta, RankAboveFour) {
  for (int rank : {5, 8, 100}) {
    absl::StatusOr<TensorMeta> m =
        CheckedMeta(int(DType::kFloat32), Shape(std::vector<int64_t>(rank, 1)), kNoLimit, "tensor 'r'");
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << rank;
    EXPECT_TRUE(Mentions(m.status(), "tensor 'r'")) << m.status();
    EXPECT_TRUE(Mentions(m.status(), absl::StrCat("got ", rank))) << m.status();
  }
}

TEST(CheckedMeta, ZeroDimensionsMakeEmptyTensors) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0}, {3, 0}, {0, 5}}) {
    absl::StatusOr<TensorMeta> m = CheckedMeta(int(DType::kInt32), Shape(shape), kNoLimit, "tensor 'e'");
    ASSERT_TRUE(m.ok()) << ShapeString(shape) << ": " << m.status();
    EXPECT_EQ(m->shape, shape);
    EXPECT_EQ(m->Bytes(), 0u);
  }
}

TEST(CheckedMeta, NegativeDimensions) {
  for (int64_t d : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    absl::StatusOr<TensorMeta> m = CheckedMeta(int(DType::kInt32), Shape({4, d}), kNoLimit, "tensor 'd'");
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_TRUE(Mentions(m.status(), "tensor 'd'")) << m.status();
    EXPECT_TRUE(Mentions(m.status(), absl::StrCat("got ", d))) << m.status();
  }
}

// The message names the value the client sent, not what the server folded it into.
TEST(CheckedMeta, UnknownDtypes) {
  for (int dtype : {5, -1, 99}) {
    absl::StatusOr<TensorMeta> m = CheckedMeta(dtype, Shape({2}), kNoLimit, "tensor 'u'");
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << dtype;
    EXPECT_TRUE(Mentions(m.status(), "tensor 'u'")) << m.status();
    EXPECT_TRUE(Mentions(m.status(), absl::StrCat("got ", dtype))) << m.status();
    EXPECT_FALSE(Mentions(m.status(), "DTYPE_UNSPECIFIED")) << m.status();
  }
}

TEST(CheckedMeta, UnspecifiedDtype) {
  absl::StatusOr<TensorMeta> m =
      CheckedMeta(int(DType::kInvalid), Shape({2}), kNoLimit, "tensor 'u'");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(m.status(), "tensor 'u'")) << m.status();
  EXPECT_TRUE(Mentions(m.status(), "got DTYPE_UNSPECIFIED (0)")) << m.status();
}

TEST(CheckedMeta, OverflowingShape) {
  absl::StatusOr<TensorMeta> m = CheckedMeta(
      int(DType::kFloat32), Shape({int64_t{1} << 32, int64_t{1} << 32}), kNoLimit, "tensor 'o'");
  EXPECT_FALSE(m.ok());
  EXPECT_TRUE(Mentions(m.status(), "tensor 'o'")) << m.status();
}

TEST(CheckedMeta, OverTheLimit) {
  absl::StatusOr<TensorMeta> m = CheckedMeta(int(DType::kInt64), Shape({129}), 1024, "tensor 'l'");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Mentions(m.status(), "1032")) << m.status();
}

}  // namespace
}  // namespace opserve
