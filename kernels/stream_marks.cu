#include "kernels/stream_marks.h"

namespace opserve::kernels {
namespace {

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void timestamp_kernel(uint64_t* dst) { *dst = GlobalTimer(); }

// 16-byte words where both ends allow them, bytes for the rest.
// Every block starts after the work before it on the stream has ended, so the first thread's
// first read of the timer stands for that moment.
__global__ void copy_to_host_kernel(const unsigned char* src, unsigned char* dst, uint64_t bytes,
                                    bool vector, uint64_t* stamp) {
  const uint64_t tid = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (stamp != nullptr && tid == 0) *stamp = GlobalTimer();
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t done = 0;
  if (vector) {
    const uint64_t words = bytes / 16;
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = tid; i < words; i += stride) d[i] = s[i];
    done = words * 16;
  }
  for (uint64_t i = done + tid; i < bytes; i += stride) dst[i] = src[i];
}

__global__ void timer_step_kernel(uint64_t* out) {
  // The smallest change seen over 64 changes, or 0 if the timer did not move in 2^20 reads.
  uint64_t prev = GlobalTimer(), step = ~0ull;
  int changes = 0;
  for (int i = 0; i < (1 << 20) && changes < 64; ++i) {
    const uint64_t t = GlobalTimer();
    if (t != prev) {
      step = min(step, t - prev);
      ++changes;
      prev = t;
    }
  }
  *out = changes == 0 ? 0 : step;
}

}  // namespace

cudaError_t LaunchTimestamp(uint64_t* dst, cudaStream_t stream) {
  timestamp_kernel<<<1, 1, 0, stream>>>(dst);
  return LastLaunchError();
}

cudaError_t LaunchCopyToHost(const void* src, void* dst, uint64_t bytes, cudaStream_t stream,
                             uint64_t* stamp) {
  if (bytes == 0) return stamp != nullptr ? LaunchTimestamp(stamp, stream) : cudaSuccess;
  const bool vector = (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0;
  constexpr int kThreads = 256;
  const uint64_t per_thread = vector ? 16 : 1;
  const uint64_t blocks = CeilDiv<uint64_t>(CeilDiv<uint64_t>(bytes, per_thread), kThreads);
  copy_to_host_kernel<<<static_cast<unsigned>(blocks < 64 ? blocks : 64), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst), bytes, vector,
      stamp);
  return LastLaunchError();
}

cudaError_t MeasureTimerStep(uint64_t* step_ns, cudaStream_t stream) {
  uint64_t* d = nullptr;
  cudaError_t err = cudaMalloc(&d, sizeof(uint64_t));
  if (err != cudaSuccess) return err;
  timer_step_kernel<<<1, 1, 0, stream>>>(d);
  err = cudaPeekAtLastError();
  if (err == cudaSuccess) err = cudaMemcpyAsync(step_ns, d, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaFree(d);
  return err;
}

}  // namespace opserve::kernels
