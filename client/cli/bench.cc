#include "client/cli/bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/format.h"
#include "client/execute_stream.h"
#include "client/graph_json.h"

namespace opserve::cli {

const char kBenchUsage[] = R"(bench flags (opserve-cli bench, in the manner of perf_analyzer):
  --graph=GRAPH.json          the graph to send, as `run` takes it; or a built-in one:
  --op=OP --shape=RxC         one node of OP over random inputs (matmul: --shape=MxKxN)
  --dtype=T                   float32 (default), int32, int64 or bfloat16
  --algorithm=NAME            the algorithm the node asks for (default: the server chooses)
  --inputs=inline|stored      inline (default): the inputs travel in every request; stored:
                              they are uploaded once and referenced, then deleted
  --concurrency=N|A:B[:S]     requests in flight: one level, or a sweep from A to B by S
                              (default 1, at most 256); with --stream, streams
  --stream [--inflight=K]     send over ExecuteStream instead of unary Execute: each of the
                              --concurrency callers keeps one stream with K requests in flight
                              (default 4, at most 256), so N streams carry N x K requests
  --duration_s=S              seconds per level (default 5 when --requests is not given)
  --requests=N                requests per level (the level still ends after 600 s)
  --warmup=N                  requests per caller before each level's clock starts (default 2)
  --allow_remote              allow a target other than the loopback interface
  --json                      one JSON object instead of the table
  --bytes=N [--repeat=R]      instead: time PutTensor and GetTensor of N bytes, R times
)";

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultLevelSeconds = 5;
// Bounds on one level whatever the flags say: its length, its request count, and the latency
// samples kept for percentiles (8 bytes each).
constexpr double kMaxLevelSeconds = 600;
constexpr int64_t kMaxLevelRequests = 10'000'000;
constexpr int64_t kMaxLevelSamples = 4'000'000;
// A level stops once this many requests have failed: the figures would mean nothing anyway.
constexpr int64_t kMaxLevelErrors = 100;
// The deadline of each call when --timeout is not given, so no caller can wait for ever.
constexpr absl::Duration kDefaultCallTimeout = absl::Seconds(60);
// Wide enough for the numbers of a level (a p99 of 9999999 us, 99999.9 req/s) to align.
constexpr size_t kMinColumnWidth = 8;
constexpr int kMaxWarmupRequests = 1000;
constexpr char kStoredPrefix[] = "__opserve_cli_bench";

absl::StatusOr<int64_t> PositiveInt(absl::string_view name, absl::string_view value, int64_t max) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n <= 0 || n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " wants an integer in [1, ", max, "], got '", value, "'"));
  }
  return n;
}

absl::StatusOr<v1::DType> ParseDType(absl::string_view value) {
  const std::string lower = absl::AsciiStrToLower(value);
  if (lower == "float32") return v1::FLOAT32;
  if (lower == "int32") return v1::INT32;
  if (lower == "int64") return v1::INT64;
  if (lower == "bfloat16") return v1::BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype wants float32, int32, int64 or bfloat16, got '", value, "'"));
}

// "1024x1024", "64,32,16"; "scalar" for rank 0.
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view value) {
  std::vector<int64_t> shape;
  if (value == "scalar") return shape;
  for (absl::string_view part : absl::StrSplit(value, absl::ByAnyChar("x,"))) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d) || d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shape wants dimensions >= 1 joined by 'x' (e.g. 1024x1024), got '", value, "'"));
    }
    shape.push_back(d);
  }
  return shape;
}

// The target names this host's loopback interface: the bench is a load generator, and pointing
// it at someone else's server takes --allow_remote.
bool IsLoopbackTarget(absl::string_view target) {
  absl::ConsumePrefix(&target, "dns:///");
  absl::ConsumePrefix(&target, "ipv4:");
  absl::ConsumePrefix(&target, "ipv6:");
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) return true;
  for (absl::string_view host : {"localhost:", "127.", "[::1]:"}) {
    if (absl::StartsWith(target, host)) return true;
  }
  return false;
}

// ---- the graph ----

// Random values of `dtype`: floats in [-1, 1], small integers, so reductions stay finite.
client::HostTensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                std::mt19937_64& rng) {
  client::HostTensor t;
  t.dtype = dtype;
  t.shape = shape;
  uint64_t count = 1;
  for (int64_t d : shape) count *= static_cast<uint64_t>(d);
  t.data.resize(count * client::DTypeSize(dtype));
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int32_t> integer(-100, 100);
  char* out = t.data.data();
  for (uint64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case v1::FLOAT32: {
        const float v = real(rng);
        std::memcpy(out + 4 * i, &v, 4);
        break;
      }
      case v1::BFLOAT16: {  // the upper half of a float32
        const float v = real(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t half = static_cast<uint16_t>(bits >> 16);
        std::memcpy(out + 2 * i, &half, 2);
        break;
      }
      case v1::INT32: {
        const int32_t v = integer(rng);
        std::memcpy(out + 4 * i, &v, 4);
        break;
      }
      case v1::INT64: {
        const int64_t v = integer(rng);
        std::memcpy(out + 8 * i, &v, 8);
        break;
      }
      default:
        break;
    }
  }
  return t;
}

// One node of `op` over inline tensors "a" (and "b" for matmul), its output returned inline.
absl::StatusOr<v1::ExecuteRequest> BuiltInGraph(const BenchOptions& o) {
  std::vector<std::vector<int64_t>> shapes = {o.shape};
  if (o.op == "matmul") {
    if (o.shape.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("--op=matmul wants --shape=MxKxN, got ", client::ShapeString(o.shape)));
    }
    shapes = {{o.shape[0], o.shape[1]}, {o.shape[1], o.shape[2]}};
  }
  std::mt19937_64 rng(1);
  v1::ExecuteRequest request;
  v1::Node* node = request.add_nodes();
  node->set_id("n");
  node->set_op(o.op);
  node->set_algorithm(o.algorithm);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = i == 0 ? "a" : "b";
    absl::StatusOr<uint64_t> bytes = client::ByteSize(o.dtype, shapes[i]);
    if (!bytes.ok()) return bytes.status();
    (*request.mutable_inline_tensors())[name] =
        client::ToProto(RandomTensor(o.dtype, shapes[i], rng));
    node->add_inputs()->set_inline_name(name);
  }
  v1::OutputSpec* output = request.add_outputs();
  output->set_node("n");
  output->set_return_inline(true);
  return request;
}

std::string GraphLabel(const BenchOptions& o, const v1::ExecuteRequest& request) {
  if (!o.graph_path.empty()) {
    return absl::StrCat(o.graph_path, " (", request.nodes_size(), " node(s))");
  }
  std::string shapes = client::ShapeString(o.shape);
  if (o.op == "matmul" && o.shape.size() == 3) {
    shapes = absl::StrCat(client::ShapeString({o.shape[0], o.shape[1]}), " x ",
                          client::ShapeString({o.shape[1], o.shape[2]}));
  }
  return absl::StrCat(o.op, o.algorithm.empty() ? "" : absl::StrCat("/", o.algorithm), " ",
                      client::DTypeName(o.dtype), shapes);
}

// --inputs=stored: uploads every inline tensor once, under a name of this process, and points
// the graph's inputs at the stored copies. The destructor deletes them.
class StoredInputs {
 public:
  explicit StoredInputs(client::Client& client) : client_(client) {}
  ~StoredInputs() {
    for (const std::string& name : names_) (void)client_.DeleteTensor(name);
  }
  StoredInputs(const StoredInputs&) = delete;
  StoredInputs& operator=(const StoredInputs&) = delete;

  absl::Status Upload(v1::ExecuteRequest* request) {
    std::map<std::string, std::string> renamed;
    for (const auto& [inline_name, tensor] : request->inline_tensors()) {
      const std::string name = absl::StrCat(kStoredPrefix, ".", getpid(), ".", inline_name);
      std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
      absl::StatusOr<v1::TensorInfo> info =
          client_.PutTensor(name, tensor.dtype(), shape, tensor.data().data(), tensor.data().size(),
                            /*overwrite=*/true);
      if (!info.ok()) {
        return absl::Status(info.status().code(), absl::StrCat("uploading input '", inline_name,
                                                               "': ", info.status().message()));
      }
      names_.push_back(name);
      renamed[inline_name] = name;
    }
    for (v1::Node& node : *request->mutable_nodes()) {
      for (v1::Input& input : *node.mutable_inputs()) {
        if (input.source_case() != v1::Input::kInlineName) continue;
        const auto it = renamed.find(input.inline_name());
        if (it != renamed.end()) input.set_stored(it->second);
      }
    }
    request->clear_inline_tensors();
    return absl::OkStatus();
  }

 private:
  client::Client& client_;
  std::vector<std::string> names_;
};

// ---- one level ----

struct LevelResult {
  int concurrency = 0;
  int64_t requests = 0;  // answered OK inside the level
  int64_t errors = 0;
  double seconds = 0;  // from the start to the last answer
  double p50_us = 0, p90_us = 0, p99_us = 0, mean_us = 0, max_us = 0;
  uint64_t request_bytes = 0, response_bytes = 0;
  double server_compute_us = 0, server_queue_us = 0, server_total_us = 0;  // means
  std::string first_error;

  double Throughput() const { return seconds > 0 ? requests / seconds : 0; }
  double Gbps() const {
    return seconds > 0 ? static_cast<double>(request_bytes + response_bytes) / seconds / 1e9 : 0;
  }
};

// What one caller saw.
struct CallerTally {
  std::vector<double> latency_us;
  int64_t errors = 0;
  uint64_t request_bytes = 0, response_bytes = 0;
  double compute_us = 0, queue_us = 0, total_us = 0;
  Clock::time_point last_answer{};
  std::string first_error;
};

// Nearest-rank percentile of sorted samples.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// Tallies one answer of the level.
void Tally(CallerTally& tally, double latency_us, uint64_t request_bytes,
           const v1::ExecuteResponse& response) {
  tally.latency_us.push_back(latency_us);
  tally.request_bytes += request_bytes;
  tally.response_bytes += response.ByteSizeLong();
  tally.compute_us += response.timing().compute_us();
  tally.queue_us += response.timing().queue_us();
  tally.total_us += response.timing().total_us();
}

void TallyError(CallerTally& tally, std::atomic<int64_t>& errors, const absl::Status& s) {
  ++tally.errors;
  errors.fetch_add(1);
  if (tally.first_error.empty()) {
    tally.first_error = absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
  }
}

// `inflight` > 0: each caller keeps one ExecuteStream with that many requests in flight.
LevelResult RunLevel(client::Client& client, const v1::ExecuteRequest& request, int concurrency,
                     int inflight, double seconds, int64_t max_requests, int warmup,
                     const client::CallOptions& call) {
  const uint64_t request_bytes = request.ByteSizeLong();
  const int64_t samples_per_caller = std::max<int64_t>(1, kMaxLevelSamples / concurrency);
  std::atomic<int64_t> tickets{0};
  std::atomic<int64_t> errors{0};
  Clock::time_point start, deadline;
  // Every caller finishes its warm-up, then the clock starts for all of them at once.
  std::barrier sync(concurrency, [&]() noexcept {
    start = Clock::now();
    deadline =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  });
  std::vector<CallerTally> tallies(concurrency);
  std::vector<std::thread> callers;
  callers.reserve(concurrency);
  for (int c = 0; c < concurrency; ++c) {
    callers.emplace_back([&, c] {
      CallerTally& tally = tallies[c];
      // A copy per caller: no two threads serialize one message.
      const v1::ExecuteRequest mine = request;
      for (int i = 0; i < warmup; ++i) (void)client.Execute(mine, call);
      sync.arrive_and_wait();
      // Answers kept: on a stream the reading thread adds them while the writing one asks.
      std::atomic<int64_t> kept{0};
      const auto more = [&] {
        return Clock::now() < deadline && tickets.fetch_add(1) < max_requests &&
               errors.load() < kMaxLevelErrors && kept.load() < samples_per_caller;
      };
      if (inflight > 0) {
        // The reader thread alone touches the tally until the stream is over.
        const absl::Status s = client::DriveExecuteStream(
            client, mine, inflight, more, [&](const client::StreamAnswer& a) {
              tally.last_answer = Clock::now();
              if (a.response.has_status()) {
                TallyError(tally, errors,
                           absl::Status(static_cast<absl::StatusCode>(a.response.status().code()),
                                        a.response.status().message()));
                return;
              }
              Tally(tally, a.latency_us, request_bytes + a.response.id().size(),
                    a.response.response());
              kept.fetch_add(1);
            }, call);
        if (!s.ok()) TallyError(tally, errors, s);
        return;
      }
      while (more()) {
        const Clock::time_point sent = Clock::now();
        absl::StatusOr<v1::ExecuteResponse> response = client.Execute(mine, call);
        const Clock::time_point answered = Clock::now();
        tally.last_answer = answered;
        if (!response.ok()) {
          TallyError(tally, errors, response.status());
          continue;
        }
        Tally(tally, std::chrono::duration<double, std::micro>(answered - sent).count(),
              request_bytes, *response);
        kept.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();

  LevelResult r;
  r.concurrency = concurrency;
  std::vector<double> all;
  Clock::time_point last = start;
  for (CallerTally& t : tallies) {
    all.insert(all.end(), t.latency_us.begin(), t.latency_us.end());
    r.errors += t.errors;
    r.request_bytes += t.request_bytes;
    r.response_bytes += t.response_bytes;
    r.server_compute_us += t.compute_us;
    r.server_queue_us += t.queue_us;
    r.server_total_us += t.total_us;
    last = std::max(last, t.last_answer);
    if (r.first_error.empty()) r.first_error = t.first_error;
  }
  r.requests = static_cast<int64_t>(all.size());
  r.seconds = std::chrono::duration<double>(last - start).count();
  if (r.requests > 0) {
    std::sort(all.begin(), all.end());
    double sum = 0;
    for (double v : all) sum += v;
    r.mean_us = sum / r.requests;
    r.max_us = all.back();
    r.p50_us = Percentile(all, 50);
    r.p90_us = Percentile(all, 90);
    r.p99_us = Percentile(all, 99);
    r.server_compute_us /= r.requests;
    r.server_queue_us /= r.requests;
    r.server_total_us /= r.requests;
  }
  return r;
}

// ---- the report ----

std::string LevelJson(const LevelResult& r) {
  return absl::StrFormat(
      "{\"concurrency\": %d, \"requests\": %d, \"errors\": %d, \"seconds\": %.6f, "
      "\"throughput_rps\": %.3f, \"latency_us\": {\"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f, "
      "\"mean\": %.1f, \"max\": %.1f}, \"request_bytes\": %d, \"response_bytes\": %d, "
      "\"client_gbps\": %.6f, \"server_compute_us_mean\": %.2f, \"server_queue_us_mean\": %.2f, "
      "\"server_total_us_mean\": %.2f, \"first_error\": %s}",
      r.concurrency, r.requests, r.errors, r.seconds, r.Throughput(), r.p50_us, r.p90_us, r.p99_us,
      r.mean_us, r.max_us, r.request_bytes, r.response_bytes, r.Gbps(), r.server_compute_us,
      r.server_queue_us, r.server_total_us,
      r.first_error.empty() ? "null" : JsonQuote(r.first_error));
}

std::vector<int> Levels(const BenchOptions& o) {
  std::vector<int> levels;
  for (int c = o.concurrency_start; c <= o.concurrency_end; c += o.concurrency_step) {
    levels.push_back(c);
  }
  return levels;
}

// ---- the transfer measurement ----

// CPU seconds this process has used: with wall time, it tells a client-bound transfer from one
// bound by the network or the server.
double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double Gbps(uint64_t bytes, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

void PrintFailure(const absl::Status& status, bool from_server) {
  std::cerr << FailureText(status, from_server) << "\n";
}

// PutTensor and GetTensor of a float32 tensor of `bytes`, `repeat` times (client/TUNING.md).
int RunTransferBench(client::Client& c, uint64_t bytes, int repeat, std::ostream& out) {
  client::HostTensor tensor;
  tensor.dtype = v1::FLOAT32;
  tensor.shape = {static_cast<int64_t>(bytes / 4)};
  tensor.data.resize(bytes / 4 * 4);
  std::mt19937_64 random(1);
  for (size_t i = 0; i + 8 <= tensor.data.size(); i += 8) {
    const uint64_t bits = random();
    std::memcpy(tensor.data.data() + i, &bits, 8);
  }
  const std::string name = "__opserve_cli_bench";
  for (int i = 0; i < repeat; ++i) {
    absl::Time start = absl::Now();
    double cpu = CpuSeconds();
    absl::StatusOr<v1::TensorInfo> info = c.PutTensor(name, tensor, /*overwrite=*/true);
    const absl::Duration put = absl::Now() - start;
    const double put_cpu = CpuSeconds() - cpu;
    if (!info.ok()) {
      PrintFailure(info.status(), true);
      return 1;
    }
    start = absl::Now();
    cpu = CpuSeconds();
    absl::StatusOr<client::HostTensor> back = c.GetTensor(name);
    const absl::Duration get = absl::Now() - start;
    const double get_cpu = CpuSeconds() - cpu;
    if (!back.ok()) {
      PrintFailure(back.status(), true);
      return 1;
    }
    if (back->data != tensor.data) {
      PrintFailure(absl::DataLossError("round trip differs"), false);
      return 1;
    }
    out << absl::StrFormat(
        "%s chunk %d: put %.3f s %.2f GB/s (client cpu %.2f s), get %.3f s %.2f GB/s (client "
        "cpu %.2f s)\n",
        FormatBytes(tensor.data.size()), c.options().chunk_bytes, absl::ToDoubleSeconds(put),
        Gbps(tensor.data.size(), put), put_cpu, absl::ToDoubleSeconds(get),
        Gbps(tensor.data.size(), get), get_cpu);
  }
  (void)c.DeleteTensor(name);
  return 0;
}

}  // namespace

bool IsBenchFlag(absl::string_view name, bool* takes_value) {
  static const char* const kWithValue[] = {"graph",      "op",       "shape",  "dtype",
                                           "algorithm",  "inputs",   "warmup", "concurrency",
                                           "duration_s", "requests", "bytes",  "repeat",
                                           "inflight"};
  for (const char* flag : kWithValue) {
    if (name == flag) {
      *takes_value = true;
      return true;
    }
  }
  if (name == "allow_remote" || name == "stream") {
    *takes_value = false;
    return true;
  }
  return false;
}

absl::Status SetBenchFlag(absl::string_view name, absl::string_view value, BenchOptions* o) {
  if (name == "graph") {
    o->graph_path = std::string(value);
  } else if (name == "op") {
    o->op = std::string(value);
  } else if (name == "shape") {
    absl::StatusOr<std::vector<int64_t>> shape = ParseShape(value);
    if (!shape.ok()) return shape.status();
    o->shape = *std::move(shape);
  } else if (name == "dtype") {
    absl::StatusOr<v1::DType> dtype = ParseDType(value);
    if (!dtype.ok()) return dtype.status();
    o->dtype = *dtype;
  } else if (name == "algorithm") {
    o->algorithm = std::string(value);
  } else if (name == "inputs") {
    if (value != "inline" && value != "stored") {
      return absl::InvalidArgumentError(
          absl::StrCat("--inputs wants inline or stored, got '", value, "'"));
    }
    o->stored_inputs = value == "stored";
  } else if (name == "warmup") {
    int64_t n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 0 || n > kMaxWarmupRequests) {
      return absl::InvalidArgumentError(absl::StrCat("--warmup wants an integer in [0, ",
                                                     kMaxWarmupRequests, "], got '", value, "'"));
    }
    o->warmup_requests = static_cast<int>(n);
  } else if (name == "concurrency") {
    std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
    if (parts.size() > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency wants N or START:END[:STEP], got '", value, "'"));
    }
    int64_t numbers[3] = {0, 0, 1};
    for (size_t i = 0; i < parts.size(); ++i) {
      absl::StatusOr<int64_t> n = PositiveInt("concurrency", parts[i], kMaxBenchConcurrency);
      if (!n.ok()) return n.status();
      numbers[i] = *n;
    }
    if (parts.size() == 1) numbers[1] = numbers[0];
    if (numbers[1] < numbers[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency: the end is below the start in '", value, "'"));
    }
    o->concurrency_start = static_cast<int>(numbers[0]);
    o->concurrency_end = static_cast<int>(numbers[1]);
    o->concurrency_step = static_cast<int>(numbers[2]);
  } else if (name == "duration_s") {
    double seconds = 0;
    if (!absl::SimpleAtod(value, &seconds) || !(seconds > 0) || seconds > kMaxLevelSeconds) {
      return absl::InvalidArgumentError(absl::StrCat("--duration_s wants seconds in (0, ",
                                                     kMaxLevelSeconds, "], got '", value, "'"));
    }
    o->duration_s = seconds;
  } else if (name == "requests") {
    absl::StatusOr<int64_t> n = PositiveInt(name, value, kMaxLevelRequests);
    if (!n.ok()) return n.status();
    o->requests = *n;
  } else if (name == "bytes") {
    absl::StatusOr<int64_t> n = PositiveInt(name, value, int64_t{1} << 40);
    if (!n.ok()) return n.status();
    o->transfer_bytes = static_cast<uint64_t>(*n);
  } else if (name == "repeat") {
    absl::StatusOr<int64_t> n = PositiveInt(name, value, 1000);
    if (!n.ok()) return n.status();
    o->transfer_repeat = static_cast<int>(*n);
  } else if (name == "allow_remote") {
    o->allow_remote = true;
  } else if (name == "stream") {
    o->stream = true;
  } else if (name == "inflight") {
    absl::StatusOr<int64_t> n = PositiveInt(name, value, kMaxBenchConcurrency);
    if (!n.ok()) return n.status();
    o->inflight = static_cast<int>(*n);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown bench flag --", name));
  }
  return absl::OkStatus();
}

int RunBench(client::Client& client, const BenchOptions& o, bool json, std::ostream& out) {
  auto usage_error = [](absl::string_view message) {
    std::cerr << "opserve-cli: bench: " << message << " (see opserve-cli --help)\n";
    return 2;
  };
  if (!o.allow_remote && !IsLoopbackTarget(client.options().target)) {
    return usage_error(absl::StrCat("the target ", client.options().target,
                                    " is not on loopback; add --allow_remote to load it"));
  }
  if (o.transfer_bytes.has_value()) {
    if (!o.graph_path.empty() || !o.op.empty()) {
      return usage_error("--bytes measures transfers; it does not go with --graph or --op");
    }
    return RunTransferBench(client, *o.transfer_bytes, o.transfer_repeat, out);
  }
  if (o.graph_path.empty() == o.op.empty()) {
    return usage_error("give either --graph=FILE.json or --op=OP --shape=RxC");
  }
  if (!o.op.empty() && o.shape.empty() && o.op != "sum") {
    return usage_error(absl::StrCat("--op=", o.op, " needs --shape"));
  }

  absl::StatusOr<v1::ExecuteRequest> request =
      o.graph_path.empty() ? BuiltInGraph(o) : client::LoadGraphFile(o.graph_path);
  if (!request.ok()) {
    PrintFailure(request.status(), false);
    return 1;
  }
  const std::string label = GraphLabel(o, *request);
  StoredInputs stored(client);
  if (o.stored_inputs) {
    if (absl::Status s = stored.Upload(&*request); !s.ok()) {
      PrintFailure(s, true);
      return 1;
    }
  }
  client::CallOptions call;
  if (client.options().timeout == absl::InfiniteDuration()) call.timeout = kDefaultCallTimeout;

  // One request first, the way perf_analyzer validates its model: a graph the server refuses
  // fails here, once, rather than as thousands of errors.
  if (absl::StatusOr<v1::ExecuteResponse> first = client.Execute(*request, call); !first.ok()) {
    PrintFailure(first.status(), true);
    return 1;
  }

  const double seconds =
      o.duration_s.value_or(o.requests ? kMaxLevelSeconds : kDefaultLevelSeconds);
  const int64_t max_requests = o.requests.value_or(kMaxLevelRequests);
  std::vector<LevelResult> results;
  Table table({{"concurrency", true},
               {"requests", true},
               {"errors", true},
               {"req/s", true},
               {"p50_us", true},
               {"p90_us", true},
               {"p99_us", true},
               {"GB/s", true},
               {"server_compute_us", true},
               {"server_queue_us", true}});
  // Each level's row is written and flushed as soon as it is measured, pipe or not: a sweep
  // runs for minutes, and whoever watches it (or tails its log) sees each level as it ends.
  // The columns are therefore as wide as their headers, not as their widest cell.
  if (!json) {
    out << absl::StrFormat(
        "bench %s, inputs %s,%s %s per level, target %s\n", label,
        o.stored_inputs ? "stored" : "inline",
        o.stream ? absl::StrCat(" ExecuteStream (concurrency: streams, each with ", o.inflight,
                                " requests in flight),")
                 : "",
        o.requests ? absl::StrCat(*o.requests, " requests") : absl::StrCat(seconds, " s"),
        client.options().target);
    out << table.HeaderLine(kMinColumnWidth) << std::flush;
  } else {
    // The object's fields before its levels, the levels as they come, "]}" after the last.
    out << absl::StrFormat(
               "{\"graph\": %s, \"inputs\": \"%s\", \"target\": %s, \"duration_s\": %s, "
               "\"requests\": %s, \"warmup\": %d, \"stream_inflight\": %s, \"levels\": [",
               JsonQuote(label), o.stored_inputs ? "stored" : "inline",
               JsonQuote(client.options().target),
               o.duration_s ? absl::StrCat(*o.duration_s)
                            : (o.requests ? "null" : absl::StrCat(seconds)),
               o.requests ? absl::StrCat(*o.requests) : "null", o.warmup_requests,
               o.stream ? absl::StrCat(o.inflight) : "null")
        << std::flush;
  }
  for (int concurrency : Levels(o)) {
    LevelResult r =
        RunLevel(client, *request, concurrency, o.stream ? o.inflight : 0, seconds, max_requests,
                 o.warmup_requests, call);
    if (!json) {
      out << table.RowLine(
                 {absl::StrCat(r.concurrency), absl::StrCat(r.requests), absl::StrCat(r.errors),
                  absl::StrFormat("%.1f", r.Throughput()), absl::StrFormat("%.0f", r.p50_us),
                  absl::StrFormat("%.0f", r.p90_us), absl::StrFormat("%.0f", r.p99_us),
                  absl::StrFormat("%.4f", r.Gbps()), absl::StrFormat("%.1f", r.server_compute_us),
                  absl::StrFormat("%.1f", r.server_queue_us)},
                 kMinColumnWidth)
          << std::flush;
    } else {
      out << (results.empty() ? "" : ", ") << LevelJson(r) << std::flush;
    }
    const bool failed = r.errors > 0;
    results.push_back(std::move(r));
    if (failed) break;  // the server is refusing: the next levels would measure errors
  }

  if (json) out << "]}\n" << std::flush;
  for (const LevelResult& r : results) {
    if (r.errors > 0) {
      std::cerr << "opserve-cli: bench: " << r.errors << " request(s) failed at concurrency "
                << r.concurrency << "; the first: " << r.first_error << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace opserve::cli
