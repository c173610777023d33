// Element types: what the client and the server share about them. Values match opserve.v1.DType,
// so a proto enum value converts with a cast (after IsValidDType).
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace opserve {

enum class DType : int { kInvalid = 0, kFloat32 = 1, kInt32 = 2, kInt64 = 3, kBFloat16 = 4 };

// Every dtype of the API, in enum order.
inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kInt32, DType::kInt64,
                                       DType::kBFloat16};

bool IsValidDType(int value);
uint64_t ElementSize(DType dtype);         // 0 for kInvalid
absl::string_view DTypeName(DType dtype);  // "FLOAT32", ...; "DTYPE_UNSPECIFIED" for kInvalid
absl::string_view NumpyName(DType dtype);  // "float32", ...; "unspecified" for kInvalid

}  // namespace opserve
