// min: the smallest element of a tensor, a scalar of the input's dtype (numpy's np.min). The Min
// operator of the reduction family (server/ops/reduce_family.h, kernels/reduce.h): its shape rule
// refuses an empty tensor (min has no identity), NaN propagates, and every row is exact.
#include "server/ops/op.h"
#include "server/ops/reduce_family.h"

namespace opserve::ops {
namespace {

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  return reduce_family::InferWholeNoIdentity("min", in);
}

absl::Status Reference(const KernelArgs& a) {
  return reduce_family::ExtremumReference(a, reduce_family::Extremum::kMin);
}

}  // namespace

OpEntry MinOp() {
  return reduce_family::WholeEntry<kernels::Min>({
      .name = "min",
      .description = "the smallest element, as a scalar of the input's dtype; a NaN anywhere "
                     "gives NaN (numpy's np.min); an empty tensor is refused (no identity)",
      .infer = Infer,
      .reference = Reference,
      .reference_description = "one pass, NaN-propagating",
      .test = reduce_family::WholeModel(ErrorScale::kExact, reduce_family::ExactTolerance),
      .cuda_auto = reduce_family::ChooseWholeCuda,
  });
}

}  // namespace opserve::ops
