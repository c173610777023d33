// A tensor held in host memory by the client: what .npy files, PutTensor and GetTensor exchange.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "opserve/v1/opserve.pb.h"

namespace opserve::client {

// `data` holds little-endian, row-major element bytes, as on the wire. It is a std::string
// rather than a proto `bytes` field because a tensor may exceed the 2 GiB a message can carry.
struct HostTensor {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // empty: a scalar
  std::string data;
};

// Bytes per element; 0 for DTYPE_UNSPECIFIED and values this client does not know.
uint64_t DTypeSize(v1::DType dtype);

// "float32", "int32", "int64", "bfloat16"; "unspecified" otherwise.
absl::string_view DTypeName(v1::DType dtype);

// Element count of `shape`: INVALID_ARGUMENT for a negative dimension or an overflow.
absl::StatusOr<uint64_t> ElementCount(absl::Span<const int64_t> shape);

// product(shape) * DTypeSize(dtype), with the same checks plus an unknown dtype.
absl::StatusOr<uint64_t> ByteSize(v1::DType dtype, absl::Span<const int64_t> shape);

// "[64, 48]"; "[]" for a scalar.
std::string ShapeString(absl::Span<const int64_t> shape);

// Conversions to and from the proto form; FromProto checks the byte count against the shape.
v1::Tensor ToProto(const HostTensor& tensor);
v1::Tensor ToProto(HostTensor&& tensor);  // moves the data instead of copying it
absl::StatusOr<HostTensor> FromProto(const v1::Tensor& tensor);

}  // namespace opserve::client
