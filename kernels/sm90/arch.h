// Which compilation passes may emit Hopper instructions, and whether the kernel the driver loaded
// for this device is one of them.
//
// nvcc compiles each .cu once per architecture of OPSERVE_CUDA_ARCHS (8.0 to 12.0) and once for
// the host. TMA (cp.async.bulk.tensor), mbarrier transaction counts and the other PTX of
// kernels/sm90/ exist from compute capability 9.0 on, so device code that uses them is compiled
// only where OPSERVE_SM90_ENABLED is defined, in the manner of CUTLASS's
// CUTLASS_ARCH_MMA_SM90_SUPPORTED; in the other passes such a kernel's body is a trap. Two checks
// keep that body from ever running: the kernel's row in the op table needs compute capability 9.0
// (so validation never sends a node to it on an older device), and the launcher asks
// LoadedForSm90 before it launches (so a build without any 9.0+ pass, e.g. OPSERVE_CUDA_ARCHS=
// 80-virtual JIT-compiled on a Hopper, refuses instead of trapping). The primitives in
// kernels/sm90/*.cuh are not guarded themselves: a caller outside a guard fails to assemble for
// sm_80, at build time.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define OPSERVE_SM90_ENABLED 1
#endif

namespace opserve::kernels::sm90 {

// True when `kernel` (a __global__ function's address), as loaded for the current device, was
// compiled from PTX of compute capability 9.0 or newer (cudaFuncAttributes::ptxVersion, the
// check CUB's PtxVersion makes): then its OPSERVE_SM90_ENABLED body is the one that runs.
// False when the lookup fails, leaving no error behind for the caller's launch check.
bool LoadedForSm90(const void* kernel);

}  // namespace opserve::kernels::sm90
