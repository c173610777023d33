// Tensor metadata: the vocabulary of the ops and the engine.
// Plain C++ (no protobuf): the proto's types are converted once, in validation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace opserve {

constexpr int kMaxRank = 4;

struct TensorMeta {
  DType dtype = DType::kInvalid;
  std::vector<int64_t> shape;

  int64_t NumElements() const;  // 1 for rank 0
  uint64_t Bytes() const { return static_cast<uint64_t>(NumElements()) * ElementSize(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  std::string DebugString() const;  // "FLOAT32[4096,4096]"
  bool operator==(const TensorMeta&) const = default;
};

std::string ShapeString(const std::vector<int64_t>& shape);  // "[4096,4096]"

// A client-supplied name for an error message: quoted, C-escaped, and cut to 64 bytes, so that
// no request can make an answer arbitrarily large (gRPC refuses oversized status metadata).
std::string Quote(absl::string_view name);

// Checks a client-supplied dtype and shape: a known dtype, rank 0..4, every dimension >= 0 (a zero
// makes an empty tensor), and a byte count that neither overflows nor exceeds `max_bytes`. `what` names the culprit in the
// message ("tensor 'A'", "inline tensor 'x'").
absl::Status CheckMeta(const TensorMeta& meta, uint64_t max_bytes, absl::string_view what);


}  // namespace opserve
