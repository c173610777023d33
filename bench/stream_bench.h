// Pipelined requests against the unary floor (--ops=stream): the real `opserve` on loopback,
// a stored FLOAT32[10, 2048] row_mean sent over ExecuteStream (S streams, each with K requests
// in flight: client/execute_stream.h) and gRPC's floor, unary grpc.health.v1 Health/Check from
// as many blocking threads as there are requests in flight, all on one channel. The series take
// turns in short windows (`rounds` of them each), so that a slow spell of the host falls on all.
#pragma once

#include <string>
#include <vector>

namespace opserve::bench {

struct StreamBenchOptions {
  std::string opserve_bin;
  std::vector<std::string> server_args;  // appended to the server's command line
  double seconds = 3;  // per series, over all its windows (each also warms up first)
  int rounds = 6;      // windows per series
};

// One series: Health/Check at a concurrency, or row_mean over streams x in flight per stream.
struct StreamPoint {
  std::string name;  // "health 64", "stream 16x4", ...
  int in_flight = 0;
  int64_t requests = 0;
  double req_per_s = 0;
  double p50_us = 0, p99_us = 0;
};

struct StreamFigures {
  bool ran = false;
  std::string error;
  std::vector<StreamPoint> points;
  const StreamPoint* Find(const std::string& name) const;
};

StreamFigures RunStreamBench(const StreamBenchOptions& options);
void PrintStream(const StreamFigures& f);

struct Report;
// 64 in flight (16 streams x 4) >= 1.5x Health/Check at 64; 16 in flight (4 streams x 4) >= 1.5x
// Health/Check at 16.
void AddStreamTargets(const StreamFigures& f, Report& rep);

}  // namespace opserve::bench
