#include "client/host_tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"

namespace opserve::client {

// The proto's values are common/dtype.h's: its table answers for both.
static_assert(static_cast<int>(DType::kFloat32) == v1::FLOAT32 &&
                  static_cast<int>(DType::kInt32) == v1::INT32 &&
                  static_cast<int>(DType::kInt64) == v1::INT64 &&
                  static_cast<int>(DType::kBFloat16) == v1::BFLOAT16,
              "common/dtype.h's values must be opserve.v1.DType's");
uint64_t DTypeSize(v1::DType dtype) { return ElementSize(static_cast<DType>(dtype)); }

absl::string_view DTypeName(v1::DType dtype) { return NumpyName(static_cast<DType>(dtype)); }

absl::StatusOr<uint64_t> ElementCount(absl::Span<const int64_t> shape) {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", dim, " in shape ", ShapeString(shape)));
    }
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has more than 2^64 elements"));
    }
  }
  return count;
}

absl::StatusOr<uint64_t> ByteSize(v1::DType dtype, absl::Span<const int64_t> shape) {
  const uint64_t element = DTypeSize(dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", v1::DType_Name(dtype),
                                                   " (", static_cast<int>(dtype), ")"));
  }
  absl::StatusOr<uint64_t> count = ElementCount(shape);
  if (!count.ok()) return count.status();
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(*count, element, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " has more than 2^64 bytes"));
  }
  return bytes;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

v1::Tensor ToProto(const HostTensor& tensor) {
  v1::Tensor proto;
  proto.set_dtype(tensor.dtype);
  proto.mutable_shape()->Add(tensor.shape.begin(), tensor.shape.end());
  proto.set_data(tensor.data);
  return proto;
}

v1::Tensor ToProto(HostTensor&& tensor) {
  v1::Tensor proto;
  proto.set_dtype(tensor.dtype);
  proto.mutable_shape()->Add(tensor.shape.begin(), tensor.shape.end());
  proto.set_data(std::move(tensor.data));
  return proto;
}

absl::StatusOr<HostTensor> FromProto(const v1::Tensor& tensor) {
  HostTensor host;
  host.dtype = tensor.dtype();
  host.shape.assign(tensor.shape().begin(), tensor.shape().end());
  absl::StatusOr<uint64_t> bytes = ByteSize(host.dtype, host.shape);
  if (!bytes.ok()) return bytes.status();
  if (*bytes != tensor.data().size()) {
    return absl::InvalidArgumentError(absl::StrCat(DTypeName(host.dtype), ShapeString(host.shape),
                                                   " needs ", *bytes, " bytes of data, found ",
                                                   tensor.data().size()));
  }
  host.data = tensor.data();
  return host;
}

}  // namespace opserve::client
