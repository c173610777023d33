// The Open Inference Protocol over HTTP/REST (server/http) against its gRPC binding on the same
// server in the same run: a 10x2048 FP32 row_mean as JSON against ModelInfer with
// raw_input_contents (p50s, interleaved); 128 MiB as Triton's binary tensor data; and 1 GiB
// through a system shared memory region registered over HTTP, against a cudaMemcpy of the same
// bytes from cudaHostRegister'ed memory (no anchor without a GPU). The HTTP client is civetweb's
// (mg_connect_client, mg_get_response), one keep-alive connection; the JSON is RapidJSON's.
// On the CPU backend (--server_arg=--device=cpu) with --http_mib for smaller sizes it runs
// anywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opserve::bench {

struct HttpOptions {
  std::string opserve_bin;
  std::vector<std::string> server_args;
  uint64_t shm_mib = 1024;  // the shared memory transfer; the binary one is an eighth of it
  int reps = 5;             // timed, after one warm-up
  int small_requests = 2000;
  bool gpu = true;  // measure the registered host-to-device anchor
};

struct HttpFigures {
  bool ran = false;
  std::string error;
  double json_p50_us = 0, grpc_p50_us = 0;  // 10x2048 row_mean
  uint64_t binary_bytes = 0, shm_bytes = 0;
  double binary_gbps = 0;          // input bytes / wall, binary tensor data
  double shm_gbps = 0;             // input bytes / wall, system shared memory
  double h2d_registered_gbps = 0;  // the anchor; 0 without a GPU
};

HttpFigures RunHttpBench(const HttpOptions& options);
void PrintHttp(const HttpFigures& f);
struct Report;
void AddHttpTargets(const HttpFigures& f, Report& rep);

}  // namespace opserve::bench
