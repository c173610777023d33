// row_max: [rows, cols] -> [rows], the largest element of each row in the input's dtype (numpy's
// np.max(x, axis=1)). The Max operator of the reduction family (server/ops/reduce_family.h,
// kernels/reduce.h): rows of zero length are refused (max has no identity; [0, C] is fine), NaN
// propagates, and every row is exact.
#include "server/ops/op.h"
#include "server/ops/reduce_family.h"

namespace opserve::ops {
namespace {

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  return reduce_family::InferRowsNoIdentity("row_max", in);
}

absl::Status Reference(const KernelArgs& a) {
  return reduce_family::RowExtremumReference(a, reduce_family::Extremum::kMax);
}

}  // namespace

OpEntry RowMaxOp() {
  return reduce_family::RowEntry<kernels::Max>({
      .name = "row_max",
      .description = "[rows, cols] -> [rows], the largest element of each row in the input's "
                     "dtype; a NaN in a row gives NaN (numpy's np.max); [R, 0] is refused (no "
                     "identity), [0, C] gives [0]",
      .infer = Infer,
      .reference = Reference,
      .reference_description = "one pass a row, NaN-propagating",
      .test = reduce_family::RowModel(ErrorScale::kExact, reduce_family::ExactTolerance),
      .cuda_auto = reduce_family::ChooseRowsCuda,
  });
}

}  // namespace opserve::ops
