// The minimum-blocks argument of __launch_bounds__, capped at what one SM of the architecture
// being compiled holds. ptxas ignores a larger one with a warning ("Value of minnctapersm ... is
// out of range") rather than capping it, and then the kernel is not held to the register count
// the hint implies there.
#pragma once

namespace opserve::kernels {

// Per SM (CUDA C++ Programming Guide, "Compute Capabilities"; ptxas agrees): 2048 threads and 32
// blocks on 8.0, 9.0 and 10.x; 1536 threads and 16 blocks on 8.6 and 8.7; 1536 threads and 24
// blocks on 8.9, 11.0 and 12.x. The host pass sees the 8.0 figures: there the bound is unused.
constexpr int MaxThreadsPerSm() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || \
                               __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1100)
  return 1536;
#else
  return 2048;
#endif
}

constexpr int MaxBlocksPerSm() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870)
  return 16;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1100)
  return 24;
#else
  return 32;
#endif
}

// `wanted` blocks of `threads`, or as many as the SM holds.
constexpr int LaunchMinBlocks(int threads, int wanted) {
  const int by_threads = MaxThreadsPerSm() / threads;
  const int fits = by_threads < MaxBlocksPerSm() ? by_threads : MaxBlocksPerSm();
  return wanted < fits ? wanted : fits;
}

}  // namespace opserve::kernels
