// Shared types of opserve-bench: one measured row, the service-path figures, and the report
// writers (bench_report.cc). Plain C++.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/concurrency_bench.h"
#include "bench/http_bench.h"
#include "bench/kserve_bench.h"
#include "bench/replay_bench.h"
#include "bench/stream_bench.h"

namespace opserve::bench {

// One timed thing: a table algorithm, an `auto` resolution, or a ceiling.
struct Row {
  std::string op;         // an op of the table ("sum", "matmul", ...), or "ceiling"
  std::string shape;      // "4096x4096", "M x N x K" for matmul
  std::string dtype;      // "FLOAT32", "INT32", "BFLOAT16", "TF32" (tensor_core on FLOAT32)
  std::string algorithm;  // table name, "auto->NAME", or the ceiling's name
  bool is_anchor = false;
  int reps = 0;
  double median_us = 0, min_us = 0, p90_us = 0;
  uint64_t bytes = 0;  // the op's Cost (minimal bytes); for copies, read + written
  uint64_t flops = 0;
  double gbps = 0, tflops = 0;
  std::string anchor;  // what `ratio` compares with
  double ratio = 0;    // > 1: faster than the anchor
  std::string anchor2;
  double ratio2 = 0;
  double vs_best = 0;  // auto rows: best algorithm's time / auto's time (1 = as fast)
  std::string best;    // auto rows: the fastest algorithm of the same precision
  double error = -1;   // relative error against the anchor's output; -1 not checked
  bool error_ok = true;
};

struct ServiceFigures {
  bool ran = false;
  std::string error;            // why it did not run
  std::string algorithm;        // what the server's auto ran
  int executes = 0, health_checks = 0;
  double execute_p50_us = 0, execute_p99_us = 0;
  double kernel_p50_us = 0;     // NodeResult.kernel_us
  double overhead_p50_us = 0;   // execute p50 - kernel p50
  double health_p50_us = 0, health_p99_us = 0;  // raw unary Health/Check: gRPC's floor
  double client_health_p50_us = 0;               // the client library's HealthServing
  // The server's own account (ExecuteResponse.timing), p50 of each part.
  double server_total_p50_us = 0, server_queue_p50_us = 0, server_input_p50_us = 0,
         server_compute_p50_us = 0, server_output_p50_us = 0;
  double put_gbps = 0, get_gbps = 0;  // 1 GiB, median of the reps
  std::vector<double> put_gbps_all, get_gbps_all;
};

struct TargetCheck {
  std::string what;
  std::string measured;
  bool holds = false;
  // Not a hold and not a miss: `auto` runs the anchor's own kernel on the same inputs, so the
  // ratio is 1 by construction and its printed digits are noise.
  bool tie = false;
};

struct Report {
  std::string device;
  std::string date;
  std::string command;
  double copy_gbps = 0, stream_gbps = 0;
  double floor_us = 0;  // an empty one-warp kernel, timed like every run
  std::vector<Row> rows;
  ServiceFigures service;
  ConcurrencyFigures load;  // the service under concurrent load (concurrency_bench.h)
  ReplayFigures replay;     // CUDA-graph replay of the demo graph (replay_bench.h)
  KServeFigures kserve;     // the Open Inference Protocol's transfers (kserve_bench.h)
  HttpFigures http;         // the protocol over HTTP/REST against gRPC (http_bench.h)
  StreamFigures stream;     // pipelined requests against the unary floor (stream_bench.h)
  std::vector<TargetCheck> targets;
};

// The console table (one row per measurement), then the target lines.
void PrintReport(const Report& report);
// DIR/bench.csv and DIR/bench.json; false with a message on stderr when a file cannot be written.
bool WriteReport(const Report& report, const std::string& dir);

}  // namespace opserve::bench
