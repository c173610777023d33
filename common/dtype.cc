#include "common/dtype.h"

namespace opserve {

bool IsValidDType(int value) { return value >= 1 && value <= 4; }

uint64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBFloat16:
      return 2;
    case DType::kInvalid:
      break;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "FLOAT32";
    case DType::kInt32:
      return "INT32";
    case DType::kInt64:
      return "INT64";
    case DType::kBFloat16:
      return "BFLOAT16";
    case DType::kInvalid:
      break;
  }
  return "DTYPE_UNSPECIFIED";
}

}  // namespace opserve
