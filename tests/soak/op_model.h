// The soak's view of the ops, all read from the op table (server/ops/op.h): which ops and
// dtypes the server's CPU backend runs, input shapes shaped like each op's test.small_shapes,
// expected outputs from the table's CPU reference rows, and results compared by
// tests/support/result_check.h. The soak keeps no op list and no reference of its own, so a
// new op is soaked without editing it.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/host_tensor.h"
#include "server/engine/backend.h"
#include "server/ops/op.h"

namespace opserve::soak {

using Shapes = std::vector<std::vector<int64_t>>;  // one shape per input

// An op the soak sends, with the input dtypes the server runs it on with --device=cpu.
struct SoakOp {
  const OpSpec* spec;
  std::vector<v1::DType> dtypes;

  bool Runs(v1::DType dtype) const;
};
std::span<const SoakOp> SoakOps();

// A CPU backend like the server's: its ExecEnvs run the reference rows.
Backend& CpuDevice();

// Input shapes for `op` in the form of one of its small_shapes cases: each distinct size of the
// case becomes one drawn within a factor of two of it, and sizes equal in the case stay equal
// (matmul's shared K stays shared). `input0`, when given, fixes input 0's shape. nullopt when
// no case, so drawn, is one the op accepts with `dtype` inputs.
std::optional<Shapes> DrawShapes(const OpSpec& op, v1::DType dtype,
                                 const std::vector<int64_t>* input0, std::mt19937_64& rng);

// Random inputs: floats in [-1, 1] (bfloat16: rounded from those), int32 in [-1000, 1000],
// int64 in [-2^40, 2^40].
client::HostTensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                std::mt19937_64& rng);

// A tensor as a client knows it. `tensor` holds its exact bytes where the client wrote them or
// has read them back. For an op's output not yet read back it holds the CPU reference's output,
// and the server's may differ from it as far as the op's tolerance allows.
struct Expected {
  client::HostTensor tensor;
  const OpSpec* op = nullptr;  // set for an output compared by tolerance
  std::string algorithm;       // the algorithm the server reported for it
  std::vector<client::HostTensor> inputs;  // what the reference ran on

  bool Exact() const { return op == nullptr; }
  uint64_t Bytes() const { return tensor.data.size(); }
  TensorMeta Meta() const;
};

Expected Exactly(client::HostTensor tensor);

// The CPU reference row of `op` run on `inputs` in `env`. An output that result_check compares
// bit for bit (any dtype but FLOAT32) is exact from the start.
absl::StatusOr<Expected> Reference(const OpSpec& op, const std::vector<const Expected*>& inputs,
                                   ExecEnv& env);

// OK when `got` has the expected dtype and shape and bytes equal to an exact tensor, or within
// the op's tolerance of its reference output (NaN never passes). Otherwise why not.
absl::Status Compare(const Expected& expected, const client::HostTensor& got);

}  // namespace opserve::soak
