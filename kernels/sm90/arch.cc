#include "kernels/sm90/arch.h"

#include <cuda_runtime_api.h>

namespace opserve::kernels::sm90 {

bool LoadedForSm90(const void* kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.ptxVersion >= 90;
}

}  // namespace opserve::kernels::sm90
