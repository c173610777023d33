// How far an op's output is from the CPU reference's, measured as the op's test model says
// (OpSpec::test.error_scale, server/ops/op.h). The GPU suite and the soak both check results
// here, so a kernel and the server are held to one measure. Host bytes only: no CUDA.
#pragma once

#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/ops/op.h"

namespace opserve {

// One run of `op` to check: its inputs (host bytes), the output under test and the CPU
// reference's output, both `output_meta.Bytes()` long.
struct OpResult {
  const OpSpec& op;
  std::span<const TensorMeta> input_meta;
  std::span<const void* const> inputs;
  const TensorMeta& output_meta;
  const void* got;
  const void* reference;
};

// The relative error of a FLOAT32 output by the op's error scale; 0 for an output of any other
// dtype, or of an op whose error scale is kExact (max, min), that equals the reference bit for
// bit. An error status, naming the element, where a measured FLOAT32 output holds NaN (never
// written?) or an exact output differs from the reference.
absl::StatusOr<double> RelativeError(const OpResult& result);

// OK when RelativeError is within the op's tolerance for `algorithm` on the inputs' dtype;
// otherwise a status that says by how much it is not.
absl::Status CheckResult(const OpResult& result, absl::string_view algorithm);

}  // namespace opserve
