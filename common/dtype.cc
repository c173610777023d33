#include "common/dtype.h"

#include <iterator>

namespace opserve {
namespace {

// One row per dtype: everything else is a lookup here.
struct DTypeInfo {
  DType dtype;
  uint64_t size;
  absl::string_view name;        // the proto's, as the server's messages print it
  absl::string_view numpy_name;  // as numpy and the CLI print it
  absl::string_view oip_name;    // the Open Inference Protocol's datatype (KServe v2, Triton)
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, 4, "FLOAT32", "float32", "FP32"},
    {DType::kInt32, 4, "INT32", "int32", "INT32"},
    {DType::kInt64, 8, "INT64", "int64", "INT64"},
    {DType::kBFloat16, 2, "BFLOAT16", "bfloat16", "BF16"},
};
static_assert(std::size(kDTypes) == std::size(kAllDTypes), "one row per dtype");

const DTypeInfo* Find(DType dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype == dtype) return &d;
  }
  return nullptr;
}

}  // namespace

bool IsValidDType(int value) { return Find(static_cast<DType>(value)) != nullptr; }

uint64_t ElementSize(DType dtype) {
  const DTypeInfo* d = Find(dtype);
  return d != nullptr ? d->size : 0;
}

absl::string_view DTypeName(DType dtype) {
  const DTypeInfo* d = Find(dtype);
  return d != nullptr ? d->name : "DTYPE_UNSPECIFIED";
}

absl::string_view NumpyName(DType dtype) {
  const DTypeInfo* d = Find(dtype);
  return d != nullptr ? d->numpy_name : "unspecified";
}

absl::string_view OipName(DType dtype) {
  const DTypeInfo* d = Find(dtype);
  return d != nullptr ? d->oip_name : "INVALID";
}

std::optional<DType> DTypeFromOipName(absl::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.oip_name == name) return d.dtype;
  }
  return std::nullopt;
}

}  // namespace opserve
