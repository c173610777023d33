// max: the largest element of a tensor, a scalar of the input's dtype (numpy's np.max). The Max
// operator of the reduction family (server/ops/reduce_family.h, kernels/reduce.h): its shape rule
// refuses an empty tensor (max has no identity), NaN propagates, and every row is exact.
#include "server/ops/op.h"
#include "server/ops/reduce_family.h"

namespace opserve::ops {
namespace {

absl::StatusOr<TensorMeta> Infer(std::span<const TensorMeta> in) {
  return reduce_family::InferWholeNoIdentity("max", in);
}

absl::Status Reference(const KernelArgs& a) {
  return reduce_family::ExtremumReference(a, reduce_family::Extremum::kMax);
}

}  // namespace

OpEntry MaxOp() {
  return reduce_family::WholeEntry<kernels::Max>({
      .name = "max",
      .description = "the largest element, as a scalar of the input's dtype; a NaN anywhere "
                     "gives NaN (numpy's np.max); an empty tensor is refused (no identity)",
      .infer = Infer,
      .reference = Reference,
      .reference_description = "one pass, NaN-propagating",
      .test = reduce_family::WholeModel(ErrorScale::kExact, reduce_family::ExactTolerance),
      .cuda_auto = reduce_family::ChooseWholeCuda,
  });
}

}  // namespace opserve::ops
