// The Open Inference Protocol's request parameters that Triton acts on and opserve does not:
// refused, never ignored, so that a client never takes the plain answer for the one it asked for.
//
// - `sequence_id` (a correlation ID), `sequence_start`, `sequence_end`: opserve has no sequence
//   models, and Triton refuses a correlation ID for a model that is not one.
// - an output's `classification` (tritonclient's class_count): Triton answers the top classes as
//   BYTES strings; opserve's models answer their tensors.
//
// A value that asks for nothing (sequence_id 0 or "", a flag false, classification 0) is
// accepted, as Triton accepts it.
#pragma once

#include "absl/status/status.h"
#include "inference/grpc_service.pb.h"

namespace opserve::oip {

// INVALID_ARGUMENT naming the model and the parameter (and the output, for classification).
absl::Status CheckUnservedParameters(const inference::ModelInferRequest& request);

}  // namespace opserve::oip
