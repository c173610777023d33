// Diagnostic, not part of opserve: the warp-tiled SGEMM (kernels/matmul_warp_tiled.cuh) in
// several tile configurations against cuBLAS's pedantic SGEMM, FLOAT32 row-major, at 1024^3,
// 4096^3 and 8192^3: how the table's configurations were chosen (docs/performance/history.md).
// Each shape's entries run interleaved, round by round, on three input sets in turn (bigger
// than L2 together, as in opserve-bench); CUDA events around each run; median.
// Run: opserve-matmul-sweep [reps]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cublas_loader.h"
#include "kernels/matmul.h"
#include "kernels/matmul_warp_tiled.cuh"

namespace {

using opserve::kernels::warp_tiled::Config;
using opserve::kernels::warp_tiled::LaunchCfg;

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);    \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

__global__ void Fill(float* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * 256ull + threadIdx.x; i < n; i += gridDim.x * 256ull) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u + seed;
    h ^= h >> 13;
    p[i] = (h % 2001) * 1e-3f - 1.0f;
  }
}

struct Entry {
  std::string name;
  std::function<cudaError_t(const float*, const float*, float*, int64_t, cudaStream_t)> run;
};

template <typename Cfg>
Entry Make(const char* name) {
  return {name, [](const float* a, const float* b, float* c, int64_t n, cudaStream_t s) {
            return LaunchCfg<Cfg>(true, a, b, c, n, n, n, s);
          }};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ||x - y|| / ||y|| on the host.
double RelErr(const std::vector<float>& x, const std::vector<float>& y) {
  double d = 0, r = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    d += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    r += double(y[i]) * y[i];
  }
  return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* handle = opserve::kernels::CublasCreateHandle(s);
  if (handle == nullptr) {
    std::printf("no cuBLAS handle\n");
    return 1;
  }
  std::vector<Entry> entries = {
      {"cublas_sgemm_pedantic",
       [handle](const float* a, const float* b, float* c, int64_t n, cudaStream_t st) {
         return opserve::kernels::MatmulCublas(handle, a, b, c, n, n, n, st);
       }},
      // Thread tiles of 8 x 16 (TM 8, TN 4, WNITER 4): 8 consecutive rows of A a thread.
      Make<Config<128, 128, 16, 64, 64, 4, 8, 4, 128>>("128x128x16_w64x64_t8x16_128thr_g8"),
      Make<Config<128, 128, 8, 64, 64, 4, 8, 4, 128>>("128x128x8_w64x64_t8x16_128thr_g8"),
      Make<Config<256, 128, 8, 64, 64, 4, 8, 4, 256>>("256x128x8_w64x64_t8x16_256thr_g8"),
      Make<Config<256, 128, 16, 64, 64, 4, 8, 4, 256>>("256x128x16_w64x64_t8x16_256thr_g8"),
      Make<Config<256, 128, 8, 128, 32, 2, 8, 4, 256>>("256x128x8_w128x32_t16x8_256thr_g8"),
      // Thread tiles of 16 x 8 as 4 x 2 blocks of 4 x 4 (TM 4, TN 4, WNITER 2).
      Make<Config<256, 128, 8, 64, 64, 2, 4, 4, 256>>("256x128x8_w64x64_t16x8_256thr_g8"),
      Make<Config<256, 128, 16, 64, 64, 2, 4, 4, 256>>("256x128x16_w64x64_t16x8_256thr_g8"),
      Make<Config<256, 128, 16, 64, 64, 2, 4, 4, 256, 16>>("256x128x16_w64x64_t16x8_256thr_g16"),
      Make<Config<256, 128, 16, 128, 32, 2, 4, 4, 256>>("256x128x16_w128x32_t16x8_256thr_g8"),
      Make<Config<128, 256, 16, 64, 64, 2, 4, 4, 256>>("128x256x16_w64x64_t16x8_256thr_g8"),
      Make<Config<128, 128, 16, 64, 64, 2, 4, 4, 128>>("128x128x16_w64x64_t16x8_128thr_g8"),
      // Small C.
      Make<Config<128, 64, 16, 64, 32, 2, 8, 4, 128>>("128x64x16_w64x32_t8x8_128thr_g8"),
      Make<Config<128, 64, 8, 64, 32, 2, 8, 4, 128>>("128x64x8_w64x32_t8x8_128thr_g8"),
      Make<Config<128, 64, 16, 64, 32, 1, 4, 4, 128>>("128x64x16_w64x32_t8x8as4x4_128thr_g8"),
  };
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  constexpr int kSets = 3;
  for (int64_t n : {1024, 4096, 8192}) {
    const size_t elems = n * n;
    float *a[kSets], *b[kSets], *c;
    for (int i = 0; i < kSets; ++i) {
      CK(cudaMalloc(&a[i], elems * 4));
      CK(cudaMalloc(&b[i], elems * 4));
      Fill<<<1024, 256, 0, s>>>(a[i], elems, 1 + 2 * i);
      Fill<<<1024, 256, 0, s>>>(b[i], elems, 2 + 2 * i);
    }
    CK(cudaMalloc(&c, elems * 4));
    // The check: every entry's C against cuBLAS's, on the first set.
    std::vector<float> ref(elems), got(elems);
    std::vector<double> err(entries.size(), 0);
    for (size_t i = 0; i < entries.size(); ++i) {
      CK(entries[i].run(a[0], b[0], c, n, s));
      CK(cudaMemcpyAsync(i == 0 ? ref.data() : got.data(), c, elems * 4, cudaMemcpyDeviceToHost, s));
      CK(cudaStreamSynchronize(s));
      if (i > 0) err[i] = RelErr(got, ref);
    }
    std::vector<std::vector<double>> us(entries.size());
    int set = 0;
    for (int r = 0; r < reps; ++r) {
      for (size_t k = 0; k < entries.size(); ++k) {
        const size_t i = (k + r) % entries.size();
        set = (set + 1) % kSets;
        CK(cudaEventRecord(e0, s));
        CK(entries[i].run(a[set], b[set], c, n, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us[i].push_back(ms * 1e3);
      }
    }
    const double base = Median(us[0]);
    for (size_t i = 0; i < entries.size(); ++i) {
      const double m = Median(us[i]);
      std::printf("n=%-5lld %-42s %10.1f us %7.2f TFLOP/s  %.3fx cuBLAS  err %.1e\n",
                  static_cast<long long>(n), entries[i].name.c_str(), m, 2.0 * n * n * n / (m * 1e6),
                  base / m, err[i]);
    }
    for (int i = 0; i < kSets; ++i) {
      CK(cudaFree(a[i]));
      CK(cudaFree(b[i]));
    }
    CK(cudaFree(c));
  }
  opserve::kernels::CublasDestroyHandle(handle);
  return 0;
}
