#include "kernels/test_fault.h"

namespace opserve::kernels {
namespace {

__global__ void illegal_address_kernel(int* p) { *p = 1; }

}  // namespace

cudaError_t LaunchIllegalAddressForTest(cudaStream_t stream) {
  // Address 16 is never mapped: the write faults with cudaErrorIllegalAddress, which is sticky.
  illegal_address_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(16));
  return cudaPeekAtLastError();
}

}  // namespace opserve::kernels
