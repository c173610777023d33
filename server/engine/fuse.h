// The planner's fusion pass: rewrites a Plan's two-node patterns (FusionRules(), server/ops/op.h)
// into single kernels. Run by BuildPlan after validation, before the plan's signature is taken.
#pragma once

#include "server/engine/plan.h"
#include "server/ops/op.h"

namespace opserve {

// Fuses every pattern of `plan` that a rule has a kernel for on `device`, consumers first: in
// row_mean(transpose(matmul(A, B))) the row_mean takes the transpose (a column mean of A B),
// and the matmul then runs as it is. Recomputes each node's last_use.
void FusePlan(Plan& plan, const DeviceProperties& device);

}  // namespace opserve
