// Shape inference and cost of each op (see op_defs.cc).
#pragma once

#include <span>

#include "server/ops.h"

namespace opserve::op_defs {

absl::StatusOr<TensorMeta> InferSum(std::span<const TensorMeta> in);
Cost CostSum(std::span<const TensorMeta> in, const TensorMeta& out);
absl::StatusOr<TensorMeta> InferRowSum(std::span<const TensorMeta> in);
absl::StatusOr<TensorMeta> InferRowMean(std::span<const TensorMeta> in);
Cost CostRowReduce(std::span<const TensorMeta> in, const TensorMeta& out);
absl::StatusOr<TensorMeta> InferTranspose(std::span<const TensorMeta> in);
Cost CostTranspose(std::span<const TensorMeta> in, const TensorMeta& out);
absl::StatusOr<TensorMeta> InferMatmul(std::span<const TensorMeta> in);
Cost CostMatmul(std::span<const TensorMeta> in, const TensorMeta& out);

}  // namespace opserve::op_defs
