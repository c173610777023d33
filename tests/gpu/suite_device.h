// The device the GPU suite tests: GPU 0 at the compute capability the suite runs at.
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
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
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
