// The soak: the real `opserve` (CPU backend) on loopback under 64 concurrent clients that mix
// puts, gets, deletes, lists, graphs of every op with inline and stored inputs, and malformed
// requests (tests/soak/malformed.cc). It asserts
//   - zero unexpected errors: a malformed request gets exactly its row's code, nothing else fails;
//   - every result correct: outputs against the op table's CPU reference rows (op_model.h),
//     downloads and listings against each client's model of what it stored;
//   - memory flat after warm-up: with every client's tensors deleted after each phase, the
//     server's VmRSS at the end is at most kRssSlack * (VmRSS after warm-up) + kRssAllowance,
//     and its pool (opserve_device_memory_bytes{kind="used"}, and the bytes ListTensors shows)
//     is back to exactly what it was after warm-up: 0;
// and reports the figures one line each ("soak: ...") and as JSON ($OPSERVE_SOAK_JSON, by
// default soak_summary.json in the working directory; ctest puts it beside LastTest.log).
//
// Sized for CI on 2 shared cores: 64 clients for 45 s, 10 of them warm-up. Longer by hand:
//   OPSERVE_SOAK_SECONDS=600 OPSERVE_SOAK_CLIENTS=128 ./soak_test
// Also OPSERVE_SOAK_WARMUP_SECONDS, and OPSERVE_SOAK_SEED to repeat a run's random choices.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/ops/op.h"
#include "tests/e2e/server_process.h"
#include "tests/soak/malformed.h"
#include "tests/soak/server_probe.h"
#include "tests/soak/soak_client.h"

namespace opserve::soak {
namespace {

using Clock = std::chrono::steady_clock;

// "Flat": the server's RSS at the end may exceed its RSS after warm-up by 10% plus 16 MiB
// (allocator arenas and gRPC's per-connection buffers settle during warm-up, not to the byte).
constexpr double kRssSlack = 1.10;
constexpr uint64_t kRssAllowance = 16ull << 20;
// Execute requests queued or running on the device worker that the server accepts. Above the
// client count, so RESOURCE_EXHAUSTED from the queue is never an expected answer here: see
// the report on DeviceWorker's queue depth, which counts a finished job until its lambda returns.
constexpr int kMaxInflight = 128;
constexpr absl::Duration kProbeTimeout = absl::Seconds(10);
constexpr auto kRssSampleEvery = std::chrono::milliseconds(250);

struct Settings {
  double seconds = 45;  // load, warm-up included
  double warmup_seconds = 10;
  int clients = 64;
  uint64_t seed = 0;
  std::string json_path = "soak_summary.json";
};

double EnvDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  double d = 0;
  return v != nullptr && absl::SimpleAtod(v, &d) && d > 0 ? d : fallback;
}

Settings SettingsFromEnv() {
  Settings s;
  s.seconds = EnvDouble("OPSERVE_SOAK_SECONDS", s.seconds);
  s.warmup_seconds =
      std::min(EnvDouble("OPSERVE_SOAK_WARMUP_SECONDS", s.seconds / 4.5), s.seconds / 2);
  s.clients = std::clamp(static_cast<int>(EnvDouble("OPSERVE_SOAK_CLIENTS", s.clients)), 1, 1024);
  const char* seed = std::getenv("OPSERVE_SOAK_SEED");
  if (seed == nullptr || !absl::SimpleAtoi(seed, &s.seed)) s.seed = std::random_device{}();
  if (const char* path = std::getenv("OPSERVE_SOAK_JSON"); path != nullptr && *path != '\0') {
    s.json_path = path;
  }
  return s;
}

// The server's memory as an operator sees it, with no client request in flight.
struct Memory {
  uint64_t rss = 0;
  uint64_t pool_used = 0;     // opserve_device_memory_bytes{kind="used"}
  uint64_t listed_bytes = 0;  // the sum of ListTensors' bytes
  int64_t listed_tensors = 0;
};

absl::StatusOr<Memory> Measure(pid_t pid, int metrics_port, client::Client& c) {
  Memory m;
  absl::StatusOr<uint64_t> rss = ResidentBytes(pid);
  if (!rss.ok()) return rss.status();
  m.rss = *rss;
  absl::StatusOr<std::string> page = HttpGet(metrics_port, "/metrics", kProbeTimeout);
  if (!page.ok()) return page.status();
  absl::StatusOr<double> used = SampleValue(*page, "opserve_device_memory_bytes", "kind=\"used\"");
  if (!used.ok()) return used.status();
  m.pool_used = static_cast<uint64_t>(*used);
  absl::StatusOr<std::vector<v1::TensorInfo>> list = c.ListTensors({.timeout = kProbeTimeout});
  if (!list.ok()) return list.status();
  for (const v1::TensorInfo& info : *list) m.listed_bytes += info.bytes();
  m.listed_tensors = static_cast<int64_t>(list->size());
  return m;
}

// Every client on its own thread until `deadline`; each then deletes what it stored.
void RunPhase(std::vector<std::unique_ptr<SoakClient>>& clients, Clock::time_point deadline) {
  std::vector<std::thread> threads;
  threads.reserve(clients.size());
  for (auto& c : clients) threads.emplace_back([&c, deadline] { c->RunPhase(deadline); });
  for (std::thread& t : threads) t.join();
}

// If the server dies under load, every client waits out its calls' deadlines (the calls wait
// for the server to be ready), far past the test's timeout, and the output that says why is never
// shown. The watchdog ends the test at once instead, with the server's output.
class ServerWatchdog {
 public:
  explicit ServerWatchdog(e2e::ServerProcess& server)
      : thread_([this, &server] {
          while (!stop_.load()) {
            // WNOWAIT: the child stays unreaped, for ServerProcess to collect.
            siginfo_t info{};
            if (waitid(P_PID, server.pid(), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                info.si_pid == server.pid()) {
              std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its last output
              std::cerr << "soak: FAILED: the server exited during the load (wait status "
                        << info.si_status << "); its output:\n"
                        << server.Output() << std::flush;
              std::_Exit(1);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }) {}
  ~ServerWatchdog() {
    stop_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Nearest-rank percentile.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

std::string JsonCounts(const std::map<std::string, int64_t>& counts) {
  std::vector<std::string> items;
  for (const auto& [k, v] : counts) items.push_back(absl::StrCat("\"", k, "\": ", v));
  return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

constexpr int kLanes = 3;

TEST(Soak, MixedLoadOnLoopback) {
  const Settings settings = SettingsFromEnv();
  const std::vector<std::string> flags = {
      "--host=127.0.0.1",
      "--port=0",
      "--metrics_port=0",
      "--http_port=-1",
      "--device=cpu",
      absl::StrCat("--memory_budget_bytes=", kMemoryBudgetBytes),
      absl::StrCat("--max_graph_nodes=", kMaxGraphNodes),
      absl::StrCat("--max_inflight=", kMaxInflight),
      // Several lanes: requests overlap inside the server, as they do on a GPU by default.
      absl::StrCat("--lanes=", kLanes)};
  absl::StatusOr<std::unique_ptr<e2e::ServerProcess>> started =
      e2e::ServerProcess::Start(e2e::OpserveBinary(), flags);
  ASSERT_TRUE(started.ok()) << started.status();
  e2e::ServerProcess& server = **started;
  absl::StatusOr<int> metrics_port = MetricsPort(server.Output());
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status() << "\n" << server.Output();

  client::ClientOptions probe_options;
  probe_options.target = server.target();
  probe_options.timeout = kProbeTimeout;
  absl::StatusOr<std::unique_ptr<client::Client>> probe = client::Client::Connect(probe_options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  absl::StatusOr<bool> serving = (*probe)->HealthServing();
  ASSERT_TRUE(serving.ok() && *serving) << serving.status();

  std::vector<std::unique_ptr<SoakClient>> clients;
  for (int i = 0; i < settings.clients; ++i) {
    absl::StatusOr<std::unique_ptr<SoakClient>> c =
        SoakClient::Create(server.target(), i, settings.seed);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  std::cout << absl::StrFormat("soak: %d clients for %.0f s (%.0f s warm-up), seed %d, server %s\n",
                               settings.clients, settings.seconds, settings.warmup_seconds,
                               settings.seed, server.target())
            << std::flush;

  auto watchdog = std::make_unique<ServerWatchdog>(server);
  absl::StatusOr<Memory> idle = Measure(server.pid(), *metrics_port, **probe);
  ASSERT_TRUE(idle.ok()) << idle.status();

  const Clock::time_point start = Clock::now();
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  RunPhase(clients, start + seconds(settings.warmup_seconds));
  absl::StatusOr<Memory> warm = Measure(server.pid(), *metrics_port, **probe);
  ASSERT_TRUE(warm.ok()) << warm.status();

  // The RSS over the measured phase, sampled as it runs.
  std::atomic<bool> measuring{true};
  uint64_t rss_max = warm->rss;
  std::vector<uint64_t> rss_series;
  std::thread sampler([&] {
    while (measuring.load()) {
      if (absl::StatusOr<uint64_t> rss = ResidentBytes(server.pid()); rss.ok()) {
        rss_max = std::max(rss_max, *rss);
        rss_series.push_back(*rss);
      }
      std::this_thread::sleep_for(kRssSampleEvery);
    }
  });
  const Clock::time_point measured_start = Clock::now();
  RunPhase(clients, start + seconds(settings.seconds));
  const double load_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double measured_seconds =
      std::chrono::duration<double>(Clock::now() - measured_start).count();
  measuring.store(false);
  sampler.join();
  absl::StatusOr<Memory> end = Measure(server.pid(), *metrics_port, **probe);
  ASSERT_TRUE(end.ok()) << end.status();
  serving = (*probe)->HealthServing();
  const bool still_serving = serving.ok() && *serving;

  SoakStats stats;
  for (const auto& c : clients) stats.Merge(c->stats());
  const int64_t requests = stats.RequestsSent();
  int64_t malformed = 0;
  for (const auto& [kind, n] : stats.malformed) malformed += n;
  const double p50 = Percentile(stats.latency_us, 50), p99 = Percentile(stats.latency_us, 99);
  const double exec_p99 = Percentile(stats.execute_latency_us, 99);
  const double max_us = stats.latency_us.empty()
                            ? 0
                            : *std::max_element(stats.latency_us.begin(), stats.latency_us.end());
  const uint64_t rss_limit =
      static_cast<uint64_t>(static_cast<double>(warm->rss) * kRssSlack) + kRssAllowance;
  std::vector<std::string> kinds_tried;
  for (const MalformedKind& k : MalformedKinds()) kinds_tried.push_back(k.name);

  // SIGTERM with nothing in flight: the server drains and exits 0. The clients' connections
  // close first: while idle connections stay open, opserve's drain takes 8-22 s (see the report).
  clients.clear();
  probe->reset();
  watchdog.reset();  // the server is meant to exit now
  const Clock::time_point sigterm = Clock::now();
  server.Signal(SIGTERM);
  absl::StatusOr<int> exit_status = server.WaitForExit(std::chrono::seconds(30));
  const double exit_seconds = std::chrono::duration<double>(Clock::now() - sigterm).count();
  const bool clean_exit =
      exit_status.ok() && WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) == 0;

  // ---- the figures, one line each, for the lead to quote ----
  std::cout << absl::StrFormat("soak: requests sent: %d (%.0f/s over %.1f s)\n", requests,
                               requests / load_seconds, load_seconds)
            << "soak: requests by kind: " << JsonCounts(stats.rpcs) << "\n"
            << absl::StrFormat("soak: unexpected errors: %d\n", stats.unexpected_errors)
            << absl::StrFormat("soak: wrong results: %d of %d checked\n", stats.wrong_results,
                               stats.results_checked)
            << absl::StrFormat(
                   "soak: malformed requests: %d sent, %d answered with their "
                   "expected code; %d kinds: %s\n",
                   stats.rpcs["Malformed"], malformed, kinds_tried.size(),
                   absl::StrJoin(kinds_tried, ","))
            << "soak: graphs checked by op: " << JsonCounts(stats.graphs) << "\n"
            << absl::StrFormat(
                   "soak: server RSS idle %s, after warm-up %s, at end %s (limit %s), "
                   "max during the measured phase %s\n",
                   Mib(idle->rss), Mib(warm->rss), Mib(end->rss), Mib(rss_limit), Mib(rss_max))
            << absl::StrFormat(
                   "soak: pool used after warm-up %d B, at end %d B; "
                   "ListTensors at end: %d tensors, %d B\n",
                   warm->pool_used, end->pool_used, end->listed_tensors, end->listed_bytes)
            << absl::StrFormat(
                   "soak: p99 latency: %.0f us (all RPCs; p50 %.0f us, max %.0f us); "
                   "Execute p99 %.0f us\n",
                   p99, p50, max_us, exec_p99)
            << absl::StrFormat("soak: server still serving: %s; SIGTERM exit: %s after %.1f s\n",
                               still_serving ? "yes" : "no",
                               exit_status.ok() ? absl::StrCat("status ", *exit_status)
                                                : std::string(exit_status.status().message()),
                               exit_seconds);
  for (const std::string& p : stats.problems) std::cout << "soak: problem: " << p << "\n";
  std::cout << std::flush;

  std::vector<std::string> problems;
  for (const std::string& p : stats.problems) problems.push_back(JsonString(p));
  std::vector<std::string> series;
  for (uint64_t r : rss_series) series.push_back(absl::StrCat(r));
  const std::string json = absl::StrFormat(
      "{\"clients\": %d, \"seconds\": %.3f, \"warmup_seconds\": %.3f, \"measured_seconds\": "
      "%.3f, \"seed\": %d,\n \"requests_sent\": %d, \"requests_by_kind\": %s,\n"
      " \"unexpected_errors\": %d, \"wrong_results\": %d, \"results_checked\": %d,\n"
      " \"malformed_sent\": %d, \"malformed_expected_code\": %d, \"malformed_by_kind\": %s,\n"
      " \"graphs_by_op\": %s,\n"
      " \"latency_us\": {\"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f, \"max\": %.1f, "
      "\"execute_p99\": %.1f},\n"
      " \"rss_bytes\": {\"idle\": %d, \"warmup\": %d, \"end\": %d, \"limit\": %d, "
      "\"max_measured\": %d},\n"
      " \"rss_flat_rule\": \"end <= warmup * %.2f + %d\",\n"
      " \"pool_used_bytes\": {\"warmup\": %d, \"end\": %d}, \"listed_bytes_end\": %d,\n"
      " \"still_serving\": %s, \"sigterm_exit_status\": %d,\n"
      " \"rss_series_bytes\": [%s],\n \"problems\": [%s]}\n",
      settings.clients, load_seconds, settings.warmup_seconds, measured_seconds, settings.seed,
      requests, JsonCounts(stats.rpcs), stats.unexpected_errors, stats.wrong_results,
      stats.results_checked, stats.rpcs["Malformed"], malformed, JsonCounts(stats.malformed),
      JsonCounts(stats.graphs), p50, Percentile(stats.latency_us, 90), p99, max_us, exec_p99,
      idle->rss, warm->rss, end->rss, rss_limit, rss_max, kRssSlack, kRssAllowance, warm->pool_used,
      end->pool_used, end->listed_bytes, still_serving ? "true" : "false",
      exit_status.ok() ? *exit_status : -1, absl::StrJoin(series, ","),
      absl::StrJoin(problems, ",\n  "));
  const std::filesystem::path json_path(settings.json_path);
  if (json_path.has_parent_path()) {
    std::error_code ignored;
    std::filesystem::create_directories(json_path.parent_path(), ignored);
  }
  std::ofstream(json_path) << json;
  std::cout << "soak: summary written to " << std::filesystem::absolute(json_path).string() << "\n";

  // ---- the assertions ----
  EXPECT_EQ(stats.unexpected_errors, 0) << "see the 'soak: problem' lines";
  EXPECT_EQ(stats.wrong_results, 0) << "see the 'soak: problem' lines";
  EXPECT_GE(requests, int64_t{settings.clients} * 10) << "the soak hardly ran";
  for (const MalformedKind& k : MalformedKinds()) {
    EXPECT_GT(stats.malformed[k.name], 0) << "malformed kind " << k.name << " never answered "
                                          << absl::StatusCodeToString(k.expected);
  }
  for (const OpSpec& op : Ops()) {
    for (const char* inputs : {"inline", "stored"}) {
      EXPECT_GT(stats.graphs[absl::StrCat(op.name, "/", inputs)], 0)
          << op.name << " with " << inputs << " inputs never checked";
    }
  }
  EXPECT_LE(end->rss, rss_limit) << "server RSS grew after warm-up: " << Mib(warm->rss) << " -> "
                                 << Mib(end->rss);
  EXPECT_EQ(warm->pool_used, 0u) << "tensors left in the pool after the warm-up's cleanup";
  EXPECT_LE(end->pool_used, warm->pool_used) << "the pool grew after warm-up";
  EXPECT_EQ(end->listed_bytes, 0u);
  EXPECT_TRUE(still_serving);
  EXPECT_TRUE(clean_exit) << "SIGTERM after the soak: "
                          << (exit_status.ok() ? absl::StrCat("wait status ", *exit_status)
                                               : std::string(exit_status.status().message()))
                          << "\n"
                          << server.Output();
}

}  // namespace
}  // namespace opserve::soak
