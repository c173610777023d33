// The protocol targets: the Open Inference Protocol's ways of moving bytes, against the host
// link measured in the same run. A 1 GiB FP32 row_mean through a system shared memory region
// (and PutTensor naming one) against a cudaMemcpy of 1 GiB from cudaHostRegister'ed memory;
// the same through CUDA shared memory, input and output in the region (infer time minus kernel
// time, nothing copied), beside a unary Health/Check's p50 (gRPC's floor on this host); through
// raw_input_contents (128 MiB, inside the default message limit; the generated stub and the
// opserve client, with the server's malloc retention and without) and the same bytes as an
// Execute inline tensor; and a small inline request's p50 against opserve.v1 Execute's. Medians
// over the runs, one client, one server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opserve::bench {

struct KServeOptions {
  std::string opserve_bin;
  std::vector<std::string> server_args;
  int64_t rows = 16384, cols = 16384;  // 1 GiB of FP32
  int reps = 5;                        // timed, after one warm-up
  int small_requests = 2000;           // each of ModelInfer and Execute, interleaved
};

struct KServeFigures {
  bool ran = false;
  std::string error;
  double h2d_registered_gbps = 0;  // the ceiling: best of the reps
  double shm_infer_gbps = 0;       // input bytes / ModelInfer wall time
  double shm_put_gbps = 0;         // tensor bytes / PutTensor wall time, the region named
  double cuda_infer_us = 0, cuda_kernel_us = 0;
  double cuda_server_over_kernel_us = 0;  // median of the server's total_us - kernel_us per call
  // The same CUDA shm request at smaller sizes, to tell where the client's time over the
  // kernel goes: {MiB, client wall us, kernel us, server's time over the kernel us}, medians.
  struct CudaPoint {
    double mib = 0, wall_us = 0, kernel_us = 0, server_over_kernel_us = 0;
  };
  std::vector<CudaPoint> cuda_sizes;
  // raw_input_contents bytes / ModelInfer wall time: the generated stub (it copies the bytes into
  // the message) and the opserve client library (it sends them from the caller's buffer), against
  // the server as started and against one with --retain_freed_host_memory=false.
  double raw_gbps = 0, raw_client_gbps = 0;
  double raw_unretained_gbps = 0, raw_client_unretained_gbps = 0;
  double execute_inline_gbps = 0;  // the same bytes as an opserve.v1 Execute inline tensor
  uint64_t raw_bytes = 0;
  double infer_p50_us = 0, execute_p50_us = 0;  // 10x2048 row_mean, inline
  double health_p50_us = 0;                      // unary Health/Check: gRPC's floor
};

// The host link's ceiling: cudaMemcpy of `bytes` from registered host memory to `dev`, best of
// `reps` after a warm-up (the caller registers `host`).
double RegisteredH2D(char* host, void* dev, uint64_t bytes, int reps);

KServeFigures RunKServeBench(const KServeOptions& options);
void PrintKServe(const KServeFigures& f);
struct Report;
void AddKServeTargets(const KServeFigures& f, Report& rep);

}  // namespace opserve::bench
