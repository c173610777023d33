// common/dtype.h's table read every way: each dtype's names lead back to it, and names that are
// not in the table lead nowhere.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/dtype.h"

namespace opserve {
namespace {

TEST(DTypeTest, EveryDTypeHasItsOwnNamesAndSize) {
  std::set<std::string> names, oip_names;
  for (DType d : kAllDTypes) {
    EXPECT_TRUE(IsValidDType(static_cast<int>(d)));
    EXPECT_GT(ElementSize(d), 0u) << DTypeName(d);
    EXPECT_EQ(DTypeFromOipName(OipName(d)), d) << OipName(d);
    EXPECT_TRUE(names.insert(std::string(DTypeName(d))).second) << DTypeName(d);
    EXPECT_TRUE(oip_names.insert(std::string(OipName(d))).second) << OipName(d);
  }
}

TEST(DTypeTest, UnknownNamesAndValuesAreRefused) {
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_EQ(ElementSize(DType::kInvalid), 0u);
  EXPECT_EQ(OipName(DType::kInvalid), "INVALID");
  for (const char* name : {"", "INVALID", "FLOAT32", "fp32", "FP64", "UINT8"}) {
    EXPECT_EQ(DTypeFromOipName(name), std::nullopt) << name;
  }
}

}  // namespace
}  // namespace opserve
