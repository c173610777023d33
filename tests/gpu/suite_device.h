// The device the GPU suite tests: the GPU $OPSERVE_TEST_DEVICE names (scripts/gpu-suite.sh
// --device=cuda:1), else GPU 0, at the compute capability the suite runs at.
//
// scripts/gpu-suite.sh --max-cc=X.Y sets $OPSERVE_TEST_MAX_COMPUTE_CAPABILITY: every server the
// suite starts gets --max_compute_capability=X.Y (tests/e2e/e2e_fixture.cc), and the in-process
// tests create their CUDA backend with the same cap (SuiteCap), so the rows above it are neither
// run nor expected, as on a GPU of that capability. Unset: the GPU's own capability.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "server/ops/op.h"

namespace opserve::gpu_suite {

// The ordinal of the GPU under test: "cuda:N" in $OPSERVE_TEST_DEVICE, else 0.
inline int SuiteOrdinal() {
  const char* env = std::getenv("OPSERVE_TEST_DEVICE");
  if (env == nullptr || std::string(env).rfind("cuda:", 0) != 0) return 0;
  return std::atoi(env + 5);
}

// The suite's cap as major * 10 + minor; 0 when the suite runs uncapped. A value the server
// would refuse fails the calling test.
inline int SuiteCap() {
  const char* env = std::getenv("OPSERVE_TEST_MAX_COMPUTE_CAPABILITY");
  if (env == nullptr || *env == '\0') return 0;
  absl::StatusOr<int> cc = ParseComputeCapability(env);
  if (!cc.ok()) {
    ADD_FAILURE() << "OPSERVE_TEST_MAX_COMPUTE_CAPABILITY: " << cc.status();
    return 0;
  }
  return *cc;
}

// GPU 0 as the op table sees it in this suite: the "cuda" backend at min(its own capability,
// SuiteCap()). For tests that ask the table what a server under test offers.
class SuiteDevice final : public DeviceProperties {
 public:
  SuiteDevice() {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, SuiteOrdinal()) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, SuiteOrdinal()) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    cc_ = major * 10 + minor;
    if (const int cap = SuiteCap(); cap > 0) cc_ = std::min(cc_, cap);
  }
  std::string name() const override { return "cuda"; }
  int compute_capability() const override { return cc_; }
  // Whether the device runs `op`'s row `algorithm`.
  bool Runs(absl::string_view op, absl::string_view algorithm) const {
    return FindAlgorithm(op, algorithm, *this) != nullptr;
  }

 private:
  int cc_ = 0;
};

}  // namespace opserve::gpu_suite
