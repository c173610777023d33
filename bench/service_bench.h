// The service path of opserve-bench: the real `opserve` on loopback, driven through the client
// library (service_bench.cc).
#pragma once

#include <string>
#include <vector>

#include "bench/bench.h"

namespace opserve::bench {

struct ServiceOptions {
  std::string opserve_bin;
  int executes = 1000;       // timed Execute calls (and as many Health/Check calls, interleaved)
  int warmups = 40;
  int transfer_reps = 3;     // PutTensor / GetTensor of 1 GiB
  int64_t chunk_bytes = 0;   // the client's transfer chunk; 0: the client library's default
  std::vector<std::string> server_args;  // appended to the server's command line (--server_arg=)
};

// Starts opserve (--device=cuda --port=0 on 127.0.0.1), measures, stops it. Errors land in
// ServiceFigures::error with ran = false.
ServiceFigures RunServiceBench(const ServiceOptions& options);

}  // namespace opserve::bench
