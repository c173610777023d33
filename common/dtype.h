// Element types: what the client and the server share about them, from one table (dtype.cc):
// the proto's name and value, the element size, numpy's name and the Open Inference Protocol's
// datatype name. Values match opserve.v1.DType, so a proto enum value converts with a cast
// (after IsValidDType). The Python client mirrors the table (client/python/opserve/dtypes.py,
// checked against it by the dtype_table test).
#pragma once

#include <cstdint>
#include <optional>

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
absl::string_view OipName(DType dtype);    // "FP32", ...; "INVALID" for kInvalid
std::optional<DType> DTypeFromOipName(absl::string_view name);  // nullopt: not one of ours

}  // namespace opserve
