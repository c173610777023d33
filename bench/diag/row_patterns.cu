// Diagnostic, not part of opserve: what read patterns reach on 64 MiB / 256 MiB / 1 GiB row sums,
// timed like opserve-bench (100 us spin, events, median of 30, inputs rotated over 4 GiB). Each
// row's result is checked against CUB's on the first input set. PERFORMANCE.md quotes it
// ("Diagnostics"). Run: build/bench/diag/opserve-row-patterns (about 30 s on an H100).
#include <cuda_runtime.h>
#include <cub/device/device_segmented_reduce.cuh>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); std::exit(1);} } while (0)

__global__ void spin_kernel(long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); if (t - t0 >= (unsigned long long)ns) break; }
}
__global__ void empty_kernel(float* p) { if (p && threadIdx.x == 1023) *p = 1; }

__global__ void fill_kernel(float* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = ((h & 0xffff) + 1) / 65537.0f * 2.0f - 1.0f;
  }
}

template <bool kHint>
__device__ __forceinline__ float4 ld4(const float4* p) {
  float4 v;
  if (kHint)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// The bench's read stream (grid-stride, 8 loads/thread, 4 blocks of 256 per SM).
template <bool kHint>
__global__ void __launch_bounds__(256, 4) stream_kernel(const float4* __restrict__ in, long long n_vec, float* sink) {
  const long long threads = (long long)gridDim.x * 256, g = blockIdx.x * 256LL + threadIdx.x;
  float4 acc = make_float4(0, 0, 0, 0);
  long long base = 0;
  for (; base + 8 * threads <= n_vec; base += 8 * threads) {
    float4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = ld4<kHint>(in + base + u * threads + g);
#pragma unroll
    for (int u = 0; u < 8; ++u) { acc.x += v[u].x; acc.y += v[u].y; acc.z += v[u].z; acc.w += v[u].w; }
  }
  for (int u = 0; u < 8; ++u) { long long i = base + u * threads + g; if (i < n_vec) { float4 v = ld4<kHint>(in + i); acc.x += v.x; } }
  if (acc.x + acc.y + acc.z + acc.w == 1e30f) *sink = acc.x;
}

template <int T>
__device__ __forceinline__ float block_sum(float v, float* sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (T == 32) return v;
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) sh[w] = v;
  __syncthreads();
  float r = 0;
  if (w == 0) { r = l < T / 32 ? sh[l] : 0.f; for (int o = 16; o; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o); }
  __syncthreads();
  return r;
}

// This thread's share of p[0, nv) float4s for a team of kTeam threads (rank in it): rounds of
// kTeam * U vectors, U loads issued before any is added; nv % (kTeam * U) == 0 assumed.
template <int kTeam, int U, bool kHint>
__device__ __forceinline__ float TeamRounds(const float4* p, long long nv, int rank) {
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long b = 0; b < nv; b += kTeam * U) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld4<kHint>(p + b + u * kTeam + rank);
#pragma unroll
    for (int u = 0; u < U; ++u) { acc.x += v[u].x; acc.y += v[u].y; acc.z += v[u].z; acc.w += v[u].w; }
  }
  return (acc.x + acc.y) + (acc.z + acc.w);
}

// One block per row; U float4 per thread per round; cols/4 % (T*U) == 0 assumed.
template <int T, int U, bool kHint>
__global__ void __launch_bounds__(T) bpr_kernel(const float* __restrict__ in, float* out, long long rows, long long cols, float scale) {
  __shared__ float sh[32];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float4* p = reinterpret_cast<const float4*>(in + r * cols);
    float s = block_sum<T>(TeamRounds<T, U, kHint>(p, cols / 4, threadIdx.x), sh);
    if (threadIdx.x == 0) out[r] = s * scale;
  }
}


// Cluster split: a cluster of C CTAs per row, each reading one contiguous piece (cols / C floats)
// in rounds of T*U float4; partials combined in rank order through distributed shared memory.
template <int T, int U, int C>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(T) cluster_kernel(const float* __restrict__ in, float* out, long long rows, long long cols, float scale) {
  __shared__ float sh[32];
  __shared__ float part;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const long long r = blockIdx.x / C;
  const long long nv = cols / 4 / C;
  const float4* p = reinterpret_cast<const float4*>(in + r * cols) + rank * nv;
  float s = block_sum<T>(TeamRounds<T, U, false>(p, nv, threadIdx.x), sh);
  if (threadIdx.x == 0) part = s;
  cluster.sync();
  if (rank == 0 && threadIdx.x == 0) {
    float t = 0;
    for (int q = 0; q < C; ++q) t += *cluster.map_shared_rank(&part, q);
    out[r] = t * scale;
  }
  cluster.sync();
}


// R consecutive rows per block of T threads: T/R threads per row, U float4 each per round.
template <int T, int U, int R>
__global__ void __launch_bounds__(T) multirow_kernel(const float* __restrict__ in, float* out, long long rows, long long cols, float scale) {
  __shared__ float sh[T / 32];
  constexpr int G = T / R;  // threads per row
  const int g = threadIdx.x / G, t = threadIdx.x % G;
  const long long r = blockIdx.x * (long long)R + g;
  const float4* p = reinterpret_cast<const float4*>(in + r * cols);
  float s = TeamRounds<G, U, false>(p, cols / 4, t);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = s;
  __syncthreads();
  if (t == 0) {
    float tot = 0;
    for (int w = 0; w < G / 32; ++w) tot += sh[g * (G / 32) + w];
    out[r] = tot * scale;
  }
}

struct RowOffset { long long cols; __host__ __device__ long long operator()(long long r) const { return r * cols; } };

static cudaStream_t st;
static int sms;

double TimeMedian(int nsets, const std::function<void(int)>& run, int reps = 30) {
  std::vector<float> v;
  int set = 0;
  for (int w = 0; w < 3; ++w) { spin_kernel<<<1, 1, 0, st>>>(100000); run(set++ % nsets); }
  CK(cudaStreamSynchronize(st));
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    spin_kernel<<<1, 1, 0, st>>>(100000);
    CK(cudaEventRecord(ev[2 * i], st)); run(set++ % nsets); CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  for (int i = 0; i < reps; ++i) { float ms; CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1])); v.push_back(ms * 1000); }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(v.begin(), v.end());
  return 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
}

int main(int argc, char** argv) {
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int dev = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device %s, %d SMs\n", prop.name, sms);
  const size_t kPool = 4ull << 30;  // rotate over 4 GiB
  float* pool; CK(cudaMalloc(&pool, kPool + (8 << 20)));
  fill_kernel<<<sms * 8, 256, 0, st>>>(pool, kPool / 4, 12345u);
  float* out; CK(cudaMalloc(&out, 64 << 20));
  float* ref; CK(cudaMalloc(&ref, 64 << 20));
  CK(cudaStreamSynchronize(st));

  // Floors.
  double e1 = TimeMedian(1, [&](int) { empty_kernel<<<1, 32, 0, st>>>(nullptr); });
  double e2 = TimeMedian(1, [&](int) { empty_kernel<<<sms * 8, 256, 0, st>>>(nullptr); });
  double e3 = TimeMedian(1, [&](int) { empty_kernel<<<4096, 128, 0, st>>>(nullptr); });
  std::printf("floor: empty<<<1,32>>> %.2f us, empty<<<%d,256>>> %.2f us, empty<<<4096,128>>> %.2f us\n", e1, sms * 8, e2, e3);
  // Nothing at all between the events.
  double e0 = TimeMedian(1, [&](int) {});
  std::printf("floor: nothing between events %.2f us\n", e0);

  // 4 GiB stream ceiling (2 sets of 2 GiB? no: the bench reads 4 GiB from 2 sets; here 1 set of 4 GiB).
  const long long nv4g = kPool / 16;
  double s4 = TimeMedian(1, [&](int) { stream_kernel<false><<<sms * 4, 256, 0, st>>>((const float4*)pool, nv4g, out); });
  double s4h = TimeMedian(1, [&](int) { stream_kernel<true><<<sms * 4, 256, 0, st>>>((const float4*)pool, nv4g, out); });
  const double stream_gbps = kPool / s4 / 1e3;
  std::printf("stream 4GiB: %.1f us %.0f GB/s; with L2::256B %.1f us %.0f GB/s\n", s4, stream_gbps, s4h, kPool / s4h / 1e3);

  struct Shape { long long rows, cols; };
  for (Shape sh : {Shape{4096, 4096}, Shape{8192, 8192}, Shape{65536, 4096}, Shape{32768, 8192}, Shape{16384, 16384}}) {
    const long long rows = sh.rows, cols = sh.cols;
    const size_t bytes = rows * cols * 4;
    const int nsets = (int)std::max<size_t>(2, std::min<size_t>(kPool / bytes, std::max<size_t>(2, (256ull << 20) / bytes + 1)));
    auto in = [&](int s) { return pool + (size_t)s * rows * cols; };
    const float scale = 1.0f / cols;
    // Reference: CUB segmented on set 0.
    auto begin = thrust::make_transform_iterator(thrust::counting_iterator<long long>(0), RowOffset{cols});
    size_t tb = 0; CK(cub::DeviceSegmentedReduce::Sum(nullptr, tb, in(0), ref, rows, begin, begin + 1, st));
    void* temp; CK(cudaMalloc(&temp, tb + 16));
    { size_t t = tb; CK(cub::DeviceSegmentedReduce::Sum(temp, t, in(0), ref, rows, begin, begin + 1, st)); CK(cudaStreamSynchronize(st)); }
    std::vector<std::pair<std::string, std::function<void(int)>>> vs;
    vs.push_back({"cub_segmented", [&](int s) { size_t t = tb; cub::DeviceSegmentedReduce::Sum(temp, t, in(s), out, rows, begin, begin + 1, st); }});
    vs.push_back({"stream_same", [&](int s) { stream_kernel<false><<<(int)std::min<long long>(sms * 4, (bytes / 16 + 2047) / 2048), 256, 0, st>>>((const float4*)in(s), bytes / 16, out); }});
    vs.push_back({"stream_same_h", [&](int s) { stream_kernel<true><<<(int)std::min<long long>(sms * 4, (bytes / 16 + 2047) / 2048), 256, 0, st>>>((const float4*)in(s), bytes / 16, out); }});
    if (cols % (4 * 128 * 8) == 0) {
      vs.push_back({"bpr128x8", [&](int s) { bpr_kernel<128, 8, false><<<rows, 128, 0, st>>>(in(s), out, rows, cols, scale); }});
      vs.push_back({"bpr128x8_h", [&](int s) { bpr_kernel<128, 8, true><<<rows, 128, 0, st>>>(in(s), out, rows, cols, scale); }});
    }
    if (cols % (4 * 256 * 4) == 0) {
      vs.push_back({"bpr256x4_h", [&](int s) { bpr_kernel<256, 4, true><<<rows, 256, 0, st>>>(in(s), out, rows, cols, scale); }});
      vs.push_back({"bpr256x4", [&](int s) { bpr_kernel<256, 4, false><<<rows, 256, 0, st>>>(in(s), out, rows, cols, scale); }});
    }
    vs.push_back({"cub_segmented_2", vs[0].second});
    if (cols % (4 * 512 * 4) == 0) vs.push_back({"bpr512x4", [&](int s) { bpr_kernel<512, 4, false><<<rows, 512, 0, st>>>(in(s), out, rows, cols, scale); }});
    if (cols % (4 * 1024 * 2) == 0) vs.push_back({"bpr1024x2", [&](int s) { bpr_kernel<1024, 2, false><<<rows, 1024, 0, st>>>(in(s), out, rows, cols, scale); }});
#define MR(T, U, R) if (cols % (4 * (T / R) * U) == 0 && rows % R == 0) vs.push_back({"multirow" #R "_" #T "x" #U, [&](int s) { multirow_kernel<T, U, R><<<rows / R, T, 0, st>>>(in(s), out, rows, cols, scale); }});
    MR(512, 4, 2) MR(512, 2, 2) MR(1024, 4, 4) MR(1024, 2, 2) MR(512, 8, 2) MR(512, 2, 4) MR(512, 1, 4) MR(256, 4, 1) MR(512, 2, 1) MR(512, 4, 1) MR(256, 8, 2)
#define CL(T, U, C) if (cols % (4 * T * U * C) == 0) vs.push_back({"cluster" #C "_" #T "x" #U, [&](int s) { cluster_kernel<T, U, C><<<rows * C, T, 0, st>>>(in(s), out, rows, cols, scale); }});
    CL(256, 4, 2) CL(128, 8, 2) CL(256, 2, 2) CL(128, 4, 2) CL(256, 2, 4) CL(128, 4, 4)
    std::printf("\nshape %lldx%lld (%.1f MiB, %d sets): stream-4GiB %.0f GB/s\n", rows, cols, bytes / 1048576.0, nsets, stream_gbps);
    std::vector<float> h_ref(rows), h_out(rows);
    CK(cudaMemcpy(h_ref.data(), ref, rows * 4, cudaMemcpyDeviceToHost));
    for (auto& [name, run] : vs) {
      double us = TimeMedian(nsets, run);
      // check (not for stream rows)
      std::string chk = "-";
      if (name.rfind("stream", 0) != 0) {
        CK(cudaMemset(out, 0xFF, rows * 4));
        run(0); CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
        CK(cudaMemcpy(h_out.data(), out, rows * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (long long r = 0; r < rows; ++r) {
          double want = name.rfind("cub", 0) == 0 ? h_ref[r] : h_ref[r] / cols;
          double e = std::abs(h_out[r] - want) / (std::abs(want) + 1e-3);
          if (!(e == e)) e = 1e9;
          worst = std::max(worst, e);
        }
        chk = worst < 1e-3 ? "ok" : "BAD " + std::to_string(worst);
      }
      std::printf("  %-28s %9.2f us %7.0f GB/s %.3fx stream  %s\n", name.c_str(), us, bytes / us / 1e3, bytes / us / 1e3 / stream_gbps, chk.c_str());
      std::fflush(stdout);
    }
    cudaFree(temp);
  }
  return 0;
}
