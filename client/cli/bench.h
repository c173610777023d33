// `opserve-cli bench`: load generation in the manner of Triton's perf_analyzer. One graph (a
// graph JSON file, or one built-in op over random inputs) is sent by N concurrent callers, for
// each N of a concurrency range; each level reports throughput, client-side latency percentiles,
// client-side GB/s and the server's own compute and queue times taken from the responses.
//
// The older transfer measurement (PutTensor / GetTensor of --bytes, --repeat times) is kept for
// client/TUNING.md: `bench --bytes=N` runs it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/opserve_client.h"

namespace opserve::cli {

// Most callers one level may use: each is a thread with one request in flight.
inline constexpr int kMaxBenchConcurrency = 256;

struct BenchOptions {
  // The graph: a graph JSON file (as `run` takes) or a built-in op over random inputs.
  std::string graph_path;         // --graph
  std::string op;                 // --op: sum | row_sum | row_mean | transpose | matmul
  std::vector<int64_t> shape;     // --shape=RxC (matmul: MxKxN)
  v1::DType dtype = v1::FLOAT32;  // --dtype
  std::string algorithm;          // --algorithm, empty: the server chooses
  // --concurrency=N or START:END[:STEP].
  int concurrency_start = 1;
  int concurrency_end = 1;
  int concurrency_step = 1;
  // Each level ends at whichever comes first; with neither set, a level lasts 5 s.
  std::optional<double> duration_s;  // --duration_s
  std::optional<int64_t> requests;   // --requests
  int warmup_requests = 2;           // --warmup: per caller, before the level's clock starts
  bool stored_inputs = false;        // --inputs=stored: upload inputs once, reference them
  bool allow_remote = false;         // --allow_remote: a target other than loopback
  // --stream: each caller keeps one ExecuteStream with `inflight` requests in flight.
  bool stream = false;
  int inflight = 4;  // --inflight
  // The transfer measurement.
  std::optional<uint64_t> transfer_bytes;  // --bytes
  int transfer_repeat = 3;                 // --repeat
};

// Whether `name` (without "--") is a bench flag, and whether it takes a value.
bool IsBenchFlag(absl::string_view name, bool* takes_value);
// Stores a bench flag's value; INVALID_ARGUMENT with a usage message for a bad value.
absl::Status SetBenchFlag(absl::string_view name, absl::string_view value, BenchOptions* options);

// Runs the bench against `client` and prints the report on `out` (a table, or one JSON object).
// Returns the process exit status: 0, or 1 after printing why on stderr (a failed request
// included: a bench with errors is not a measurement).
int RunBench(client::Client& client, const BenchOptions& options, bool json, std::ostream& out);

// The usage lines of the bench flags, for the CLI's help.
extern const char kBenchUsage[];

}  // namespace opserve::cli
