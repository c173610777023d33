// Issue 14's target 4: the demo graph row_mean(transpose(matmul(A, B))) at 1024^3, A and B
// stored, sent back to back by one client to a one-lane server, once with the CUDA-graph cache
// (replayed after its first request) and once without (--graph_cache=0, node by node). The
// server's compute_us against the sum of its nodes' kernel_us, medians over the run.
#pragma once

#include <string>
#include <vector>

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
  double kernels_p50_us = 0;  // the sum of the nodes' kernel_us, per request
  double total_p50_us = 0;    // the client's latency
  int replayed = 0;           // requests that answered GRAPH_REPLAYED
  int rebound = 0;            // GRAPH_REBOUND: replayed after an update to new addresses
  int requests = 0;
};

struct ReplayFigures {
  bool ran = false;
  std::string error;
  std::vector<ReplayMode> modes;
};

ReplayFigures RunReplayBench(const ReplayOptions& options);
void PrintReplay(const ReplayFigures& f);
struct Report;
void AddReplayTargets(const ReplayFigures& f, Report& rep);

}  // namespace opserve::bench
