// Test builds only: a kernel that writes to an unmapped address, to prove that a sticky device
// error fails its own request and turns the server's health to NOT_SERVING.
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

cudaError_t LaunchIllegalAddressForTest(cudaStream_t stream);

}  // namespace opserve::kernels
