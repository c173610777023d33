// The service under concurrent load (the service targets): for each lane count, the real `opserve`
// on loopback, stored row_mean inputs, T threads on one channel (by default) making blocking Execute
// calls for a fixed time; gRPC's floor measured the same way with Health/Check in the same run.
// At each concurrency the floor and the workloads take turns in short windows (`rounds` of them
// each), so that a slow spell of the host falls on all of them.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace opserve::bench {

struct ConcurrencyOptions {
  std::string opserve_bin;
  std::vector<std::string> server_args;  // appended to the server's command line
  std::vector<int> lanes = {1, 2, 4};
  std::vector<int> concurrency = {1, 16, 64};
  std::set<std::string> workloads;  // shapes such as "10x2048"; empty: all three
  double seconds = 3;  // per point, over all its windows (each also warms up first)
  int rounds = 8;      // windows per point
  // Servers to compare in the same windows: (label, its extra arguments). Each runs at each lane
  // count, all of one lane count at once, their points taking turns with each other's. Empty:
  // one server, unlabelled.
  std::vector<std::pair<std::string, std::vector<std::string>>> variants;
  // Where every window's own figures go (a CSV), to see the spread the points average over and
  // whether a point depends on the one before it; empty: nowhere.
  std::string windows_csv;
  // Channels per server, each its own connection, thread t calling on channel t % channels (the
  // floor's Health/Checks likewise). The service targets are defined on one; more show what the
  // server does when calls do not share one connection's reads and writes.
  int channels = 1;
};

// One point: a workload at a concurrency on a server of `lanes` lanes ("health": the floor).
struct LoadPoint {
  std::string variant;  // ConcurrencyOptions::variants' label; "" without variants
  int lanes = 0;
  std::string workload;  // "row_mean 4096x4096", ..., or "health"
  int concurrency = 0;
  int64_t requests = 0;
  double req_per_s = 0;
  double p50_us = 0, p99_us = 0;
  double kernel_p50_us = 0;  // NodeResult.kernel_us; 0 for health
  double compute_p50_us = 0;  // ExecuteResponse.timing.compute_us
  // ExecuteResponse.timing.total_us (the handler's receipt to its response) and queue_us. The
  // client's p50 minus server_p50_us is what the request spends outside the handler: the
  // channel, gRPC's threads and the hand-offs to and from them.
  double server_p50_us = 0, queue_p50_us = 0;
  // Each round's window alone, in round order: how far the point's windows spread.
  std::vector<double> round_req_per_s;
};

struct ConcurrencyFigures {
  bool ran = false;
  int channels = 1;
  std::string error;
  std::vector<LoadPoint> points;
  // The point of (variant, lanes, workload, concurrency), or nullptr.
  const LoadPoint* Find(const std::string& variant, int lanes, const std::string& workload,
                        int concurrency) const;
};

ConcurrencyFigures RunConcurrencyBench(const ConcurrencyOptions& options);

struct Report;
// The service targets 1, 2, 3 and 5 for each variant and lane count measured (4 is the replay
// section's).
void AddConcurrencyTargets(const ConcurrencyFigures& f, Report& rep);

// The table, and a CSV of every point beside the bench's other files when `csv_path` is set.
void PrintConcurrency(const ConcurrencyFigures& f, const std::string& csv_path);

}  // namespace opserve::bench
