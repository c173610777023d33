// The GPU suite's server fixture: the end-to-end fixture (tests/e2e/e2e_fixture.h) with
// `opserve --device=cuda:N` (one GPU: $OPSERVE_TEST_DEVICE when it names one, else cuda:0), or the test reported skipped (never passed) where no GPU is usable.
// A subclass that sets up more after GpuServerTest::SetUp returns first when IsSkipped().
#pragma once

#include <cstdlib>

#include "server/engine/cuda_backend.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {

class GpuServerTest : public OpserveTest {
 protected:
  void SetUp() override {
    if (absl::Status s = ProbeCuda(0); !s.ok()) GTEST_SKIP() << "no usable GPU: " << s.message();
    // One GPU: the one the suite names (scripts/gpu-suite.sh --device), else the first.
    if (!IsCuda()) setenv("OPSERVE_TEST_DEVICE", "cuda:0", 1);
    OpserveTest::SetUp();
  }
};

}  // namespace opserve::e2e
