// Diagnostic, not part of opserve: what a CUDA graph's timing marks and output copy cost, in the
// shapes the server's replays take (server/engine/cuda_node_timer.h). Three 20 us kernels (and
// one of 5 us), each bracketed by external event record nodes or by timestamp kernels, the
// output (40 bytes) copied to page-locked memory by a copy node or a kernel. Per variant, the
// medians of 350 launches: the host time of cudaGraphLaunch, launch to the host seeing the end,
// and the device's span of the nodes; then 200 launches back to back, whose device time per
// graph beyond its kernels bounds how many requests one stream can run (a lane's req/s).
// PERFORMANCE.md quotes it.
// Run: build/bench/diag/opserve-graph-marks
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1);} } while (0)
using Clock = std::chrono::steady_clock;
static double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v.empty() ? 0 : v[v.size() / 2]; }
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void spin(long ns, float* out) {
  const unsigned long long t0 = gt();
  unsigned long long t = t0;
  while (t - t0 < ns) t = gt();
  if (threadIdx.x == 0) out[0] = static_cast<float>(t - t0);
}
__global__ void stamp(unsigned long long* slot) { *slot = gt(); }
// `stamp_slot`: where the copy's first thread writes the timer as it starts (the end stamp of
// the node before it, without a kernel of its own), or nullptr.
__global__ void copy_kernel(const float4* src, float4* dst, int n, unsigned long long* stamp_slot) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (stamp_slot != nullptr && i == 0) *stamp_slot = gt();
  if (i < n) dst[i] = src[i];
}
// copy: 0 none, 1 node, 2 kernel, 3 kernel that also writes the last node's end stamp
struct Variant { const char* name; int kernels; long ns; bool events, stamps; int copy; };
int main() {
  cudaStream_t s, cap;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  float* d; CK(cudaMalloc(&d, 1 << 20));
  float* h; CK(cudaMallocHost(&h, 1 << 20));
  unsigned long long* st; CK(cudaMallocHost(&st, 4096));
  cudaEvent_t done; CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  std::vector<cudaEvent_t> ev(8);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  const Variant variants[] = {
      {"3 x 20 us, no marks, no copy", 3, 20000, false, false, 0},
      {"3 x 20 us, events + copy node", 3, 20000, true, false, 1},
      {"3 x 20 us, events + copy kernel", 3, 20000, true, false, 2},
      {"3 x 20 us, stamps + copy kernel", 3, 20000, false, true, 2},
      {"1 x 5 us, no marks, no copy", 1, 5000, false, false, 0},
      {"1 x 5 us, events + copy node", 1, 5000, true, false, 1},
      {"1 x 5 us, stamps + copy kernel", 1, 5000, false, true, 2},
      {"1 x 5 us, stamp + stamping copy", 1, 5000, false, true, 3},
      {"1 x 17 us, no marks, no copy", 1, 17000, false, false, 0},
      {"1 x 17 us, stamps + copy kernel", 1, 17000, false, true, 2},
      {"1 x 17 us, stamp + stamping copy", 1, 17000, false, true, 3}};
  std::printf("%-34s %10s %16s %14s %12s %14s\n", "graph", "launch us", "launch->seen us",
              "over kernels", "device span", "b2b over us");
  for (const Variant& v : variants) {
    CK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed));
    for (int k = 0; k < v.kernels; ++k) {
      if (v.stamps && k == 0) stamp<<<1, 1, 0, cap>>>(st);
      if (v.events) CK(cudaEventRecordWithFlags(ev[2 * k], cap, cudaEventRecordExternal));
      spin<<<1, 32, 0, cap>>>(v.ns, d + 64 * k);
      if (v.events) CK(cudaEventRecordWithFlags(ev[2 * k + 1], cap, cudaEventRecordExternal));
      if (v.stamps && !(v.copy == 3 && k == v.kernels - 1)) stamp<<<1, 1, 0, cap>>>(st + k + 1);
    }
    if (v.copy == 1) CK(cudaMemcpyAsync(h, d, 40, cudaMemcpyDeviceToHost, cap));
    if (v.copy >= 2) {
      copy_kernel<<<1, 128, 0, cap>>>(reinterpret_cast<const float4*>(d), reinterpret_cast<float4*>(h), 3,
                                      v.copy == 3 ? st + v.kernels : nullptr);
    }
    cudaGraph_t g;
    CK(cudaStreamEndCapture(cap, &g));
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphUpload(x, s));
    CK(cudaStreamSynchronize(s));
    std::vector<double> launch, seen, span;
    for (int it = 0; it < 400; ++it) {
      const auto t0 = Clock::now();
      CK(cudaGraphLaunch(x, s));
      const auto t1 = Clock::now();
      CK(cudaEventRecord(done, s));
      while (cudaEventQuery(done) == cudaErrorNotReady) {
      }
      const auto t2 = Clock::now();
      if (it >= 50) {
        launch.push_back(us(t0, t1));
        seen.push_back(us(t0, t2));
        if (v.stamps) span.push_back((st[v.kernels] - st[0]) * 1e-3);
        if (v.events) {
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, ev[0], ev[2 * v.kernels - 1]));
          span.push_back(ms * 1e3);
        }
      }
      usleep(50);  // a client's gap between requests: the stream idle before each launch
    }
    const double kernels = v.kernels * v.ns * 1e-3;
    constexpr int kBackToBack = 200;
    const auto b0 = Clock::now();
    for (int it = 0; it < kBackToBack; ++it) CK(cudaGraphLaunch(x, s));
    CK(cudaStreamSynchronize(s));
    const double b2b = us(b0, Clock::now()) / kBackToBack - kernels;
    std::printf("%-34s %10.2f %16.2f %14.2f %12.2f %14.2f\n", v.name, med(launch), med(seen),
                med(seen) - kernels, med(span), b2b);
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}
