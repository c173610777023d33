// The soak test's float64 reference: what each op must return for the inputs the test sent, and
// how far the server's answer may be from it. Cheap sizes only: every loop is O(elements).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/host_tensor.h"

namespace opserve::soak {

// A tensor as the test knows it: every element as a double, which is exact for every dtype and
// range the soak draws (int64 values stay within 2^40), and per element how far the server's
// answer may be from it; 0 means bit-exact.
struct RefTensor {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::vector<double> values;
  std::vector<double> tolerance;

  bool Exact() const;
  uint64_t Bytes() const;
};

// Random inputs: floats in [-1, 1] (bfloat16: rounded from those), int32 in [-1000, 1000],
// int64 in [-2^40, 2^40].
client::HostTensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                std::mt19937_64& rng);

// The exact values of a tensor the test holds.
RefTensor FromHost(const client::HostTensor& tensor);

// The output of `op` over `inputs`, in float64, with tolerances from the way the server's CPU
// algorithms round: sum pairwise in float32, row_sum / row_mean in float64 then one rounding,
// matmul with float32 accumulation, transpose bit-exact. Reductions and matmul need exact
// inputs; transpose carries its input's tolerances along.
absl::StatusOr<RefTensor> Reference(absl::string_view op,
                                    const std::vector<const RefTensor*>& inputs);

// OK when `got` has the expected dtype and shape and every element lies within its tolerance;
// NaN never passes. Otherwise the first difference, with its index.
absl::Status Compare(const RefTensor& expected, const client::HostTensor& got);

}  // namespace opserve::soak
