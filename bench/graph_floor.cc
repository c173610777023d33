#include "bench/graph_floor.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "bench/bench_device.h"
#include "bench/service_process.h"
#include "kernels/stream_marks.h"

namespace opserve::bench {
namespace {

constexpr uint64_t kOutputBytes = 4096;  // the demo graph's output: 1024 floats

// Frees what MeasureGraphFloor made, whichever step it stopped at.
struct Resources {
  cudaStream_t stream = nullptr, capture = nullptr;
  cudaEvent_t done = nullptr;
  uint64_t* stamps = nullptr;
  void* host_out = nullptr;
  void* device_out = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Resources() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (device_out) cudaFree(device_out);
    if (host_out) cudaFreeHost(host_out);
    if (stamps) cudaFreeHost(stamps);
    if (done) cudaEventDestroy(done);
    if (capture) cudaStreamDestroy(capture);
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace

GraphFloor MeasureGraphFloor(const std::vector<double>& node_us, int launches) {
  GraphFloor f;
  Resources r;
  const int nodes = static_cast<int>(node_us.size());
  auto fail = [&](const char* what, cudaError_t e) {
    f.error = absl::StrCat(what, ": ", cudaGetErrorString(e));
    (void)cudaGetLastError();
    return f;
  };
  cudaError_t e;
  if ((e = cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking)) != cudaSuccess) return fail("stream", e);
  if ((e = cudaStreamCreateWithFlags(&r.capture, cudaStreamNonBlocking)) != cudaSuccess) return fail("stream", e);
  if ((e = cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming)) != cudaSuccess) return fail("event", e);
  if ((e = cudaMallocHost(reinterpret_cast<void**>(&r.stamps), (nodes + 1) * sizeof(uint64_t))) != cudaSuccess) {
    return fail("stamps", e);
  }
  if ((e = cudaMallocHost(&r.host_out, kOutputBytes)) != cudaSuccess) return fail("output", e);
  if ((e = cudaMalloc(&r.device_out, kOutputBytes)) != cudaSuccess) return fail("output", e);
  if ((e = cudaMemset(r.device_out, 1, kOutputBytes)) != cudaSuccess) return fail("output", e);

  if ((e = cudaStreamBeginCapture(r.capture, cudaStreamCaptureModeRelaxed)) != cudaSuccess) return fail("capture", e);
  e = kernels::LaunchTimestamp(r.stamps, r.capture);
  for (int k = 0; k < nodes && e == cudaSuccess; ++k) {
    e = Spin(static_cast<int64_t>(node_us[k] * 1e3), r.capture);
    if (e == cudaSuccess && k + 1 < nodes) e = kernels::LaunchTimestamp(r.stamps + k + 1, r.capture);
  }
  if (e == cudaSuccess) {
    e = kernels::LaunchCopyToHost(r.device_out, r.host_out, kOutputBytes, r.capture, r.stamps + nodes);
  }
  const cudaError_t ended = cudaStreamEndCapture(r.capture, &r.graph);
  if (e != cudaSuccess) return fail("graph", e);
  if (ended != cudaSuccess) return fail("capture", ended);
  if ((e = cudaGraphInstantiate(&r.exec, r.graph, 0)) != cudaSuccess) return fail("instantiate", e);
  if ((e = cudaGraphUpload(r.exec, r.stream)) != cudaSuccess) return fail("upload", e);
  if ((e = cudaStreamSynchronize(r.stream)) != cudaSuccess) return fail("upload", e);

  constexpr int kWarm = 30;
  std::vector<double> seen, span, overhead;
  for (int i = 0; i < kWarm + launches; ++i) {
    const auto t0 = Clock::now();
    if ((e = cudaGraphLaunch(r.exec, r.stream)) != cudaSuccess) return fail("launch", e);
    if ((e = cudaEventRecord(r.done, r.stream)) != cudaSuccess) return fail("event", e);
    while ((e = cudaEventQuery(r.done)) == cudaErrorNotReady) {
    }
    const double us = Us(Clock::now() - t0);
    if (e != cudaSuccess) return fail("graph", e);
    if (i >= kWarm) {
      const double s = static_cast<double>(r.stamps[nodes] - r.stamps[0]) * 1e-3;
      seen.push_back(us);
      span.push_back(s);
      overhead.push_back(us - s);
    }
    usleep(200);  // the gap one client leaves between its requests: the device idle before each
  }
  f.seen_p50_us = Percentile(seen, 0.5);
  f.span_p50_us = Percentile(span, 0.5);
  f.overhead_p50_us = Percentile(overhead, 0.5);
  f.ran = true;
  return f;
}

}  // namespace opserve::bench
