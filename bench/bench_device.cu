// Device helpers of opserve-bench: random fills, the spin, error checks (bench_device.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/bench_device.h"

namespace opserve::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 16;  // a few waves on any current GPU; the kernels grid-stride

// splitmix64: a counter-based hash, so every element is independent of the launch shape.
__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float UniformNonZero(uint64_t seed, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(Mix(seed ^ Mix(static_cast<uint64_t>(i))) >> 40);
  const float v = static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1), 2^-23 steps
  return v == 0.0f ? 0.5f : v;
}

__global__ void fill_f32_kernel(float* d, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    d[i] = UniformNonZero(seed, i);
  }
}

__global__ void fill_i32_kernel(int32_t* d, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t v = static_cast<int32_t>(Mix(seed ^ Mix(static_cast<uint64_t>(i))) % 2001) - 1000;
    d[i] = v == 0 ? 1 : v;
  }
}

__global__ void fill_i64_kernel(int64_t* d, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t v = Mix(seed ^ Mix(static_cast<uint64_t>(i)));
    d[i] = v == 0 ? 1 : static_cast<int64_t>(v);
  }
}

__global__ void fill_bf16_kernel(__nv_bfloat16* d, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = UniformNonZero(seed, i);
    // Values under bf16's resolution near 0 would round to 0: keep them off it.
    d[i] = __float2bfloat16(fabsf(v) < 1e-3f ? 0.5f : v);
  }
}

__global__ void empty_kernel() {}

__global__ void spin_kernel(int64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<int64_t>(now - start) < ns);
}

__global__ void clock_probe_kernel(float* mhz, int64_t ns) {
  uint64_t t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (static_cast<int64_t>(t1 - t0) < ns);
  const long long c1 = clock64();
  *mhz = static_cast<float>(static_cast<double>(c1 - c0) * 1e3 / static_cast<double>(t1 - t0));
}

__global__ void scale_kernel(float* d, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    d[i] *= scale;
  }
}

__global__ void error_kernel(const float* got, const float* want, int64_t n, double* sums) {
  double diff = 0, ref = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double g = got[i], w = want[i];
    // A NaN anywhere must fail: make it infinite.
    diff += isnan(g) ? INFINITY : (g - w) * (g - w);
    ref += w * w;
  }
  for (int off = 16; off > 0; off /= 2) {
    diff += __shfl_down_sync(0xffffffffu, diff, off);
    ref += __shfl_down_sync(0xffffffffu, ref, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&sums[0], diff);
    atomicAdd(&sums[1], ref);
  }
}

__global__ void mismatch64_kernel(const uint64_t* got, const uint64_t* want, int64_t n,
                                  unsigned long long* mismatches) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (got[i] != want[i]) atomicAdd(mismatches, 1ull);
  }
}

__global__ void transpose_check_kernel(const uint32_t* in, const uint32_t* out, int64_t rows,
                                       int64_t cols, unsigned long long* mismatches) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    if (out[c * rows + r] != in[i]) {
      atomicAdd(mismatches, 1ull);
      atomicMin(mismatches + 1, static_cast<unsigned long long>(i));
    }
  }
}

unsigned Grid(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

}  // namespace

cudaError_t FillRandomF32(float* d, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill_f32_kernel<<<Grid(n), kThreads, 0, stream>>>(d, n, seed);
  return cudaPeekAtLastError();
}

cudaError_t FillRandomI32(int32_t* d, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill_i32_kernel<<<Grid(n), kThreads, 0, stream>>>(d, n, seed);
  return cudaPeekAtLastError();
}

cudaError_t FillRandomI64(int64_t* d, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill_i64_kernel<<<Grid(n), kThreads, 0, stream>>>(d, n, seed);
  return cudaPeekAtLastError();
}

cudaError_t FillRandomBf16(uint16_t* d, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill_bf16_kernel<<<Grid(n), kThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(d), n, seed);
  return cudaPeekAtLastError();
}

cudaError_t EmptyKernel(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  return cudaPeekAtLastError();
}

cudaError_t Spin(int64_t ns, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaPeekAtLastError();
}

cudaError_t ClockProbe(float* d_mhz, int64_t ns, cudaStream_t stream) {
  clock_probe_kernel<<<1, 1, 0, stream>>>(d_mhz, ns);
  return cudaPeekAtLastError();
}

cudaError_t ScaleInPlace(float* d, int64_t n, float scale, cudaStream_t stream) {
  scale_kernel<<<Grid(n), kThreads, 0, stream>>>(d, n, scale);
  return cudaPeekAtLastError();
}

cudaError_t RelativeError(const float* d_got, const float* d_want, int64_t n, double* result,
                          cudaStream_t stream) {
  double* d_sums = nullptr;
  cudaError_t err = cudaMallocAsync(&d_sums, 2 * sizeof(double), stream);
  if (err != cudaSuccess) return err;
  cudaMemsetAsync(d_sums, 0, 2 * sizeof(double), stream);
  error_kernel<<<Grid(n), kThreads, 0, stream>>>(d_got, d_want, n, d_sums);
  double sums[2] = {0, 0};
  cudaMemcpyAsync(sums, d_sums, sizeof(sums), cudaMemcpyDeviceToHost, stream);
  cudaFreeAsync(d_sums, stream);
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  *result = sums[1] > 0 ? sqrt(sums[0] / sums[1]) : sqrt(sums[0]);
  return cudaGetLastError();
}

cudaError_t Mismatches64(const uint64_t* d_got, const uint64_t* d_want, int64_t n,
                         uint64_t* mismatches, cudaStream_t stream) {
  unsigned long long* d_count = nullptr;
  cudaError_t err = cudaMallocAsync(&d_count, sizeof(*d_count), stream);
  if (err != cudaSuccess) return err;
  cudaMemsetAsync(d_count, 0, sizeof(*d_count), stream);
  mismatch64_kernel<<<Grid(n), kThreads, 0, stream>>>(d_got, d_want, n, d_count);
  unsigned long long count = 0;
  cudaMemcpyAsync(&count, d_count, sizeof(count), cudaMemcpyDeviceToHost, stream);
  cudaFreeAsync(d_count, stream);
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  *mismatches = count;
  return cudaGetLastError();
}

cudaError_t TransposeMismatches(const uint32_t* d_in, const uint32_t* d_out, int64_t rows,
                                int64_t cols, uint64_t* mismatches, cudaStream_t stream,
                                int64_t* first_bad) {
  unsigned long long* d_count = nullptr;  // [0] mismatches, [1] smallest wrong index
  cudaError_t err = cudaMallocAsync(&d_count, 2 * sizeof(*d_count), stream);
  if (err != cudaSuccess) return err;
  cudaMemsetAsync(d_count, 0, sizeof(*d_count), stream);
  cudaMemsetAsync(d_count + 1, 0xFF, sizeof(*d_count), stream);
  transpose_check_kernel<<<Grid(rows * cols), kThreads, 0, stream>>>(d_in, d_out, rows, cols,
                                                                     d_count);
  unsigned long long count[2] = {0, 0};
  cudaMemcpyAsync(count, d_count, sizeof(count), cudaMemcpyDeviceToHost, stream);
  cudaFreeAsync(d_count, stream);
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  *mismatches = count[0];
  if (first_bad != nullptr) *first_bad = count[0] ? static_cast<int64_t>(count[1]) : -1;
  return cudaGetLastError();
}

}  // namespace opserve::bench
