// The service's target 4 (replay): the demo graph row_mean(transpose(matmul(A, B))) at 1024^3, A and B
// stored, sent back to back by one client to a one-lane server, once with the CUDA-graph cache
// (replayed after its first request) and once without (--graph_cache=0, node by node). The
// server's compute_us against the sum of its kernels' kernel_us (each fused kernel once: the
// transpose runs inside the row_mean's column reduction), medians over the run; and the CUDA
// floor of a graph of the same shape launched by the bench itself (graph_floor.h).
#pragma once

#include <string>
#include <vector>

#include "bench/graph_floor.h"

namespace opserve::bench {

struct ReplayOptions {
  std::string opserve_bin;
  std::vector<std::string> server_args;  // appended to the server's command line
  int64_t n = 1024;                      // M = K = N
  int requests = 300;                    // timed, after the warm-up
};

struct ReplayMode {
  std::string name;  // "replayed" or "node by node"
  int graph_cache = 0;
  double compute_p50_us = 0;
  double kernels_p50_us = 0;   // the sum of the kernels' kernel_us, per request
  double overhead_p50_us = 0;  // compute_us less that sum, per request
  std::vector<double> kernel_p50_us;  // each kernel's (a node whose fused_into is empty)
  double total_p50_us = 0;    // the client's latency
  int replayed = 0;           // requests that answered GRAPH_REPLAYED
  int rebound = 0;            // GRAPH_REBOUND: replayed after an update to new addresses
  int requests = 0;
};

struct ReplayFigures {
  bool ran = false;
  std::string error;
  std::vector<ReplayMode> modes;
  GraphFloor floor;  // for the replayed mode's kernels
};

ReplayFigures RunReplayBench(const ReplayOptions& options);
void PrintReplay(const ReplayFigures& f);
struct Report;
void AddReplayTargets(const ReplayFigures& f, Report& rep);

}  // namespace opserve::bench
