#include "server/ops/tensor.h"

#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace opserve {

int64_t TensorMeta::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string Quote(absl::string_view name) {
  constexpr size_t kMaxShown = 64;
  if (name.size() <= kMaxShown) return absl::StrCat("'", absl::CEscape(name), "'");
  return absl::StrCat("'", absl::CEscape(name.substr(0, kMaxShown)), "...' (", name.size(), " bytes)");
}

std::string TensorMeta::DebugString() const {
  return absl::StrCat(DTypeName(dtype), ShapeString(shape));
}

absl::Status CheckMeta(const TensorMeta& meta, uint64_t max_bytes, absl::string_view what) {
  // Any value outside the enum, not only kInvalid: a newer client's dtype arrives as its number
  // (MetaFromProto keeps it), and the message names what the client sent.
  if (const int value = static_cast<int>(meta.dtype); !IsValidDType(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": dtype must be FLOAT32, INT32, INT64 or BFLOAT16, got ",
        meta.dtype == DType::kInvalid ? absl::StrCat(DTypeName(meta.dtype), " (0)")
                                      : absl::StrCat(value)));
  }
  if (meta.rank() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank must be 0..", kMaxRank,
                                                   ", got ", meta.rank(), " (shape ",
                                                   ShapeString(meta.shape), ")"));
  }
  // Multiply with an overflow check: a hostile shape must not wrap around to a small size.
  uint64_t bytes = ElementSize(meta.dtype);
  for (size_t i = 0; i < meta.shape.size(); ++i) {
    const int64_t d = meta.shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": dimension ", i, " must be >= 0, got ",
                                                     d, " (shape ", ShapeString(meta.shape), ")"));
    }
    // A zero dimension makes an empty tensor (what numpy sends for an empty array); the check
    // still looks at every other dimension, so [0, -1] is refused.
    if (d > 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": shape ", ShapeString(meta.shape), " overflows 64-bit bytes"));
    }
    bytes *= static_cast<uint64_t>(d);
  }
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", meta.DebugString(), " is ", bytes,
                                                     " bytes, over the limit of ", max_bytes,
                                                     " (--max_tensor_bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace opserve
