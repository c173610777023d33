// Diagnostic, not part of opserve: where the host time of one Execute's device part goes, with
// the CUDA calls the server's worker makes for row_mean cub_segmented on 4096x4096 (output and
// CUB scratch from the stream-ordered pool, events, the launch, the staging copy, the one sync).
// PERFORMANCE.md quotes it. Run: build/bench/diag/opserve-execute-floor [0|1|2|3]
// (cudaDeviceScheduleAuto / Spin / Yield / BlockingSync).
#include <cuda_runtime.h>
#include <cub/device/device_segmented_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1);} } while (0)
struct RowOffset { long long cols; __host__ __device__ long long operator()(long long r) const { return r * cols; } };
using Clock = std::chrono::steady_clock;
static double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
__global__ void fill(float* p, size_t n) { for (size_t i = blockIdx.x * 256 + threadIdx.x; i < n; i += gridDim.x * 256) p[i] = (i % 1000) * 0.001f - 0.5f; }
int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;  // 0 auto, 1 spin, 2 yield, 3 blocking
  if (mode == 1) CK(cudaSetDeviceFlags(cudaDeviceScheduleSpin));
  if (mode == 2) CK(cudaSetDeviceFlags(cudaDeviceScheduleYield));
  if (mode == 3) CK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  cudaMemPool_t pool; CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t thr = ~0ull; CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const long long rows = 4096, cols = 4096;
  float* in; CK(cudaMalloc(&in, rows * cols * 4)); fill<<<1024, 256, 0, st>>>(in, rows * cols);
  void* staging; CK(cudaMallocHost(&staging, 1 << 20));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  auto begin = thrust::make_transform_iterator(thrust::counting_iterator<long long>(0), RowOffset{cols});
  std::vector<double> s_alloc, s_cubq, s_launch, s_copy, s_sync, s_elapsed, s_free, s_total, s_kernel;
  for (int it = 0; it < 3000; ++it) {
    auto t0 = Clock::now();
    void* out; CK(cudaMallocAsync(&out, rows * 4, st));
    auto t1 = Clock::now();
    size_t tb = 0; CK(cub::DeviceSegmentedReduce::Sum(nullptr, tb, in, (float*)out, rows, begin, begin + 1, st));
    void* temp; CK(cudaMallocAsync(&temp, std::max<size_t>(tb, 1), st));
    auto t2 = Clock::now();
    CK(cudaEventRecord(a, st));
    CK(cub::DeviceSegmentedReduce::Sum(temp, tb, in, (float*)out, rows, begin, begin + 1, st));
    CK(cudaEventRecord(b, st));
    auto t3 = Clock::now();
    CK(cudaMemcpyAsync(staging, out, rows * 4, cudaMemcpyDeviceToHost, st));
    auto t4 = Clock::now();
    CK(cudaStreamSynchronize(st));
    auto t5 = Clock::now();
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    auto t6 = Clock::now();
    CK(cudaFreeAsync(temp, st)); CK(cudaFreeAsync(out, st));
    auto t7 = Clock::now();
    if (it < 100) continue;
    s_alloc.push_back(us(t0, t1)); s_cubq.push_back(us(t1, t2)); s_launch.push_back(us(t2, t3)); s_copy.push_back(us(t3, t4));
    s_sync.push_back(us(t4, t5)); s_elapsed.push_back(us(t5, t6)); s_free.push_back(us(t6, t7)); s_total.push_back(us(t0, t7)); s_kernel.push_back(ms * 1e3);
    // a gap like the one between requests
    auto g = Clock::now(); while (us(g, Clock::now()) < 150) {}
  }
  std::printf("mode %d: total %.1f us = alloc %.1f + cub query+temp alloc %.1f + events+launch %.1f + memcpy call %.1f + sync %.1f + elapsed %.1f + frees %.1f; kernel events %.1f; total - kernel %.1f\n",
              mode, med(s_total), med(s_alloc), med(s_cubq), med(s_launch), med(s_copy), med(s_sync), med(s_elapsed), med(s_free), med(s_kernel), med(s_total) - med(s_kernel));
  return 0;
}
