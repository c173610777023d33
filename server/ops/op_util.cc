#include "server/ops/op_util.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace opserve::op_util {

absl::Status NeedRank(const TensorMeta& m, int rank, absl::string_view input) {
  if (m.rank() == rank) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(input, " must have rank ", rank, ", got ", m.DebugString()));
}

absl::Status NeedDType(const TensorMeta& m, std::span<const DType> allowed,
                       absl::string_view input) {
  for (DType d : allowed) {
    if (m.dtype == d) return absl::OkStatus();
  }
  std::string names;
  for (DType d : allowed) absl::StrAppend(&names, names.empty() ? "" : " or ", DTypeName(d));
  return absl::InvalidArgumentError(
      absl::StrCat(input, " must be ", names, ", got ", m.DebugString()));
}

}  // namespace opserve::op_util
