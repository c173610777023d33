#include "bench/concurrency_bench.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/service_process.h"

namespace opserve::bench {
namespace {

struct Workload {
  const char* name;
  const char* shape;  // what --load_workloads names
  int64_t rows, cols;
  bool by_default;  // run when --load_workloads is not given
};
// Target 1's two kernel-bound shapes and target 2's launch-bound one. 4096x4 returns what
// 4096x4096 returns (16 KiB) from a kernel of about 2 us: it tells the response's share of
// target 1 from the kernel's.
constexpr Workload kWorkloads[] = {
    {"row_mean 4096x4096", "4096x4096", 4096, 4096, true},
    {"row_mean 8192x8192", "8192x8192", 8192, 8192, true},
    {"row_mean 10x2048", "10x2048", 10, 2048, true},
    {"row_mean 4096x4", "4096x4", 4096, 4, false},
};

// What one thread saw.
struct ThreadResult {
  std::vector<double> latency_us, kernel_us, compute_us, server_us, queue_us;
  std::string error;
};

// Every call of one point, over all its windows.
struct Samples {
  ThreadResult all;
  double wall_s = 0;
};

// Each window opens with this long of calls that are not counted: the threads start, and the
// server's and the client's thread pools settle to this series after whatever ran before it.
constexpr double kWindowWarmupSeconds = 0.1;

// `threads` threads call `call` back to back for kWindowWarmupSeconds, then for `seconds` more;
// the calls that end in those `seconds` (or after, finishing) count, and their figures go to
// `into`.
template <typename Call>
void Drive(int threads, double seconds, Call call, Samples* into, std::string* error) {
  std::vector<ThreadResult> results(threads);
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  Clock::time_point measure_from, until;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      ThreadResult warm;
      while (Clock::now() < measure_from && warm.error.empty()) {
        warm = ThreadResult();  // only the last call's figures are kept
        call(warm, t);
      }
      // That last call ended after measure_from: it counts.
      results[t] = std::move(warm);
      while (Clock::now() < until && results[t].error.empty()) call(results[t], t);
    });
  }
  const auto seconds_to = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  measure_from = Clock::now() + seconds_to(kWindowWarmupSeconds);
  until = measure_from + seconds_to(seconds);
  go.store(true, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  into->wall_s += std::chrono::duration<double>(Clock::now() - measure_from).count();
  ThreadResult& a = into->all;
  for (ThreadResult& r : results) {
    if (!r.error.empty() && error->empty()) *error = r.error;
    a.latency_us.insert(a.latency_us.end(), r.latency_us.begin(), r.latency_us.end());
    a.kernel_us.insert(a.kernel_us.end(), r.kernel_us.begin(), r.kernel_us.end());
    a.compute_us.insert(a.compute_us.end(), r.compute_us.begin(), r.compute_us.end());
    a.server_us.insert(a.server_us.end(), r.server_us.begin(), r.server_us.end());
    a.queue_us.insert(a.queue_us.end(), r.queue_us.begin(), r.queue_us.end());
  }
}

LoadPoint Summarize(const Samples& s) {
  LoadPoint p;
  p.requests = static_cast<int64_t>(s.all.latency_us.size());
  p.req_per_s = s.wall_s > 0 ? p.requests / s.wall_s : 0;
  p.p50_us = Percentile(s.all.latency_us, 0.5);
  p.p99_us = Percentile(s.all.latency_us, 0.99);
  p.kernel_p50_us = Percentile(s.all.kernel_us, 0.5);
  p.compute_p50_us = Percentile(s.all.compute_us, 0.5);
  p.server_p50_us = Percentile(s.all.server_us, 0.5);
  p.queue_p50_us = Percentile(s.all.queue_us, 0.5);
  return p;
}

// One stream of calls that takes turns with the others: a server's floor or one workload on it.
struct Series {
  std::string variant;
  std::string name;  // "health" or the workload's
  std::function<void(ThreadResult&, int thread)> call;
};

// A server's clients beyond the session's own (ConcurrencyOptions::channels). Each channel has a
// subchannel pool of its own, so that gRPC does not share one connection among them.
using ExtraClients = std::vector<std::unique_ptr<client::Client>>;
constexpr char kOwnSubchannelPool[] = "grpc.use_local_subchannel_pool";

// A window's own figures, for the windows CSV.
struct Window {
  std::string variant, series, after;  // after: the series of the window before ("" first)
  int lanes, concurrency, round, position;
  int64_t requests;
  double seconds;
};

// Opens `session` on `bin` and adds its floor and workloads to `series`; "" on success. The
// stored inputs are named in `stored`; `requests` must not move while the series are in use.
// An argument "--client_arg=KEY=INT" is a channel argument of the client's, not the server's;
// "--server_bin=PATH" runs that opserve binary instead of opserve_bin (builds side by side).
std::string AddServer(const ConcurrencyOptions& opt, const std::string& variant,
                      const std::vector<std::string>& args, Session& session,
                      ExtraClients& extra, std::deque<v1::ExecuteRequest>& requests,
                      std::vector<std::string>& stored, std::vector<Series>& series) {
  std::vector<std::string> server_args;
  std::map<std::string, int> client_args;
  std::string bin = opt.opserve_bin;
  for (const std::string& a : args) {
    constexpr absl::string_view kClientArg = "--client_arg=";
    constexpr absl::string_view kServerBin = "--server_bin=";
    if (absl::StartsWith(a, kServerBin)) {
      bin = a.substr(kServerBin.size());
      continue;
    }
    if (!absl::StartsWith(a, kClientArg)) {
      server_args.push_back(a);
      continue;
    }
    const std::string kv = a.substr(kClientArg.size());
    const size_t eq = kv.find('=');
    int value = 0;
    if (eq == std::string::npos || !absl::SimpleAtoi(kv.substr(eq + 1), &value)) {
      return absl::StrCat("--client_arg wants KEY=INT, got ", kv);
    }
    client_args[kv.substr(0, eq)] = value;
  }
  if (std::string err = session.Open(bin, server_args, 0, client_args); !err.empty()) {
    return err;
  }
  std::vector<client::Client*> clients = {session.client.get()};
  for (int i = 1; i < opt.channels; ++i) {
    client::ClientOptions co;
    co.target = absl::StrCat("127.0.0.1:", session.server.port());
    co.channel_args = client_args;
    co.channel_args[kOwnSubchannelPool] = 1;
    auto conn = client::Client::Connect(co);
    if (!conn.ok()) return std::string(conn.status().message());
    clients.push_back(extra.emplace_back(*std::move(conn)).get());
  }
  // The floor: Health/Check made as Execute is below, on the same channels.
  series.push_back({variant, "health", [clients](ThreadResult& r, int thread) {
                      const auto t0 = Clock::now();
                      if (!HealthCheck(clients[thread % clients.size()]->channel().get())) {
                        r.error = "Health/Check failed";
                      }
                      r.latency_us.push_back(Us(Clock::now() - t0));
                    }});
  client::Client& c = *session.client;
  for (const Workload& w : kWorkloads) {
    if (opt.workloads.empty() ? !w.by_default : !opt.workloads.count(w.shape)) continue;
    const std::string x = RandomFloats(static_cast<uint64_t>(w.rows * w.cols));
    const int64_t shape[] = {w.rows, w.cols};
    const std::string name = absl::StrCat("load_", w.shape);
    auto put = c.PutTensor(name, v1::FLOAT32, shape, x.data(), x.size(), /*overwrite=*/true);
    if (!put.ok()) return absl::StrCat("PutTensor ", w.name, ": ", put.status().message());
    stored.push_back(name);
    const v1::ExecuteRequest& req = requests.emplace_back(RowMeanOfStored(name));
    auto execute = [clients, &req, w](ThreadResult& r, int thread) {
      const auto t0 = Clock::now();
      auto resp = clients[thread % clients.size()]->Execute(req);
      const double us = Us(Clock::now() - t0);
      if (!resp.ok() || resp->nodes_size() != 1) {
        r.error = absl::StrCat("Execute ", w.name, ": ",
                               resp.ok() ? "no node result" : resp.status().ToString());
        return;
      }
      r.latency_us.push_back(us);
      r.kernel_us.push_back(resp->nodes(0).kernel_us());
      r.compute_us.push_back(resp->timing().compute_us());
      r.server_us.push_back(resp->timing().total_us());
      r.queue_us.push_back(resp->timing().queue_us());
    };
    for (int i = 0; i < 20 * static_cast<int>(clients.size()); ++i) {  // warm: the first calls
      ThreadResult warm;                                                  // of each channel
      execute(warm, i);
    }
    series.push_back({variant, w.name, execute});
  }
  return "";
}

void WriteWindows(const std::vector<Window>& windows, const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream csv(path);
  csv << "variant,lanes,concurrency,round,position,series,after,requests,seconds,req_per_s\n";
  for (const Window& w : windows) {
    csv << w.variant << "," << w.lanes << "," << w.concurrency << "," << w.round << ","
        << w.position << "," << w.series << "," << w.after << "," << w.requests << ","
        << w.seconds << "," << (w.seconds > 0 ? w.requests / w.seconds : 0) << "\n";
  }
}

// The spread behind a ratio target: each round's req/s of `p` over that round's ceiling, the
// lower of `cap` and `health`'s req/s in the same round. The verdict stays on the whole point's
// req/s; this shows how much one run's windows can move it.
std::string RoundSpread(const LoadPoint& p, const LoadPoint& health, double cap) {
  std::vector<double> ratios;
  for (size_t r = 0; r < p.round_req_per_s.size() && r < health.round_req_per_s.size(); ++r) {
    const double ceiling = std::min(cap, health.round_req_per_s[r]);
    if (ceiling > 0) ratios.push_back(p.round_req_per_s[r] / ceiling);
  }
  if (ratios.empty()) return "";
  std::sort(ratios.begin(), ratios.end());
  // The median as scripts/load-ratios.py takes it: of an even count, the mean of the middle two.
  const size_t n = ratios.size();
  const double median = (ratios[(n - 1) / 2] + ratios[n / 2]) / 2;
  return absl::StrFormat("; rounds %.3f-%.3f, median %.3f", ratios.front(), ratios.back(), median);
}

}  // namespace

const LoadPoint* ConcurrencyFigures::Find(const std::string& variant, int lanes,
                                          const std::string& workload, int concurrency) const {
  for (const LoadPoint& p : points) {
    if (p.variant == variant && p.lanes == lanes && p.workload == workload &&
        p.concurrency == concurrency) {
      return &p;
    }
  }
  return nullptr;
}

ConcurrencyFigures RunConcurrencyBench(const ConcurrencyOptions& opt) {
  ConcurrencyFigures f;
  f.channels = opt.channels;
  if (opt.channels < 1) {
    f.error = absl::StrCat("channels must be at least 1, got ", opt.channels);
    return f;
  }
  for (const std::string& shape : opt.workloads) {
    if (std::none_of(std::begin(kWorkloads), std::end(kWorkloads),
                     [&](const Workload& w) { return shape == w.shape; })) {
      f.error = absl::StrCat("no load workload ", shape, " (",
                             absl::StrJoin(kWorkloads, ", ",
                                           [](std::string* out, const Workload& w) {
                                             out->append(w.shape);
                                           }),
                             ")");
      return f;
    }
  }
  std::vector<Window> windows;
  auto variants = opt.variants;
  if (variants.empty()) variants.push_back({"", {}});
  const int rounds = std::max(1, opt.rounds);
  for (int lanes : opt.lanes) {
    // Every variant's server at once, each with its own client channel shared by its threads.
    std::deque<Session> sessions;
    std::deque<ExtraClients> extra;  // after sessions: its channels go before their servers
    std::deque<v1::ExecuteRequest> requests;  // the calls below point into it
    std::vector<std::vector<std::string>> stored(variants.size());
    std::vector<Series> series;
    for (size_t v = 0; v < variants.size(); ++v) {
      std::vector<std::string> args = opt.server_args;
      args.insert(args.end(), variants[v].second.begin(), variants[v].second.end());
      args.push_back(absl::StrCat("--lanes=", lanes));
      if (std::string err = AddServer(opt, variants[v].first, args, sessions.emplace_back(),
                                      extra.emplace_back(), requests, stored[v], series);
          !err.empty()) {
        f.error = variants[v].first.empty() ? err : absl::StrCat(variants[v].first, ": ", err);
        return f;
      }
    }
    std::string error;
    for (int conc : opt.concurrency) {
      std::vector<Samples> samples(series.size());
      std::string after;
      for (int round = 0; round < rounds && error.empty(); ++round) {
        for (size_t k = 0; k < series.size(); ++k) {
          const size_t i = (k + round) % series.size();  // each series leads in turn
          const double wall = samples[i].wall_s;
          const size_t calls = samples[i].all.latency_us.size();
          Drive(conc, opt.seconds / rounds, series[i].call, &samples[i], &error);
          windows.push_back({series[i].variant, series[i].name, after, lanes, conc, round,
                             static_cast<int>(k),
                             static_cast<int64_t>(samples[i].all.latency_us.size() - calls),
                             samples[i].wall_s - wall});
          after = series[i].variant.empty() ? series[i].name
                                            : absl::StrCat(series[i].variant, " ", series[i].name);
        }
      }
      for (size_t i = 0; i < series.size(); ++i) {
        LoadPoint p = Summarize(samples[i]);
        p.variant = series[i].variant;
        p.lanes = lanes;
        p.concurrency = conc;
        p.workload = series[i].name;
        for (const Window& w : windows) {
          if (w.variant == p.variant && w.series == p.workload && w.lanes == lanes &&
              w.concurrency == conc) {
            p.round_req_per_s.push_back(w.seconds > 0 ? w.requests / w.seconds : 0);
          }
        }
        f.points.push_back(p);
      }
    }
    for (size_t v = 0; v < sessions.size(); ++v) {
      for (const std::string& name : stored[v]) (void)sessions[v].client->DeleteTensor(name);
    }
    if (!error.empty()) {
      f.error = error;
      return f;
    }
  }
  if (!opt.windows_csv.empty()) WriteWindows(windows, opt.windows_csv);
  f.ran = true;
  return f;
}

void AddConcurrencyTargets(const ConcurrencyFigures& f, Report& rep) {
  // The targets are defined on one channel: with more, the figures are for comparison only.
  if (!f.ran || f.channels != 1) return;
  std::vector<std::pair<std::string, int>> servers;  // (variant, lanes) in the order run
  for (const LoadPoint& p : f.points) {
    const std::pair<std::string, int> s = {p.variant, p.lanes};
    if (std::find(servers.begin(), servers.end(), s) == servers.end()) servers.push_back(s);
  }
  for (const auto& [v, l] : servers) {
    const std::string at = absl::StrCat("load, ", v, v.empty() ? "" : ", ", l,
                                        l == 1 ? " lane: " : " lanes: ");
    // 1. Kernel-bound shapes at c=16: against the lower of the kernel-bound rate and the floor.
    const LoadPoint* health16 = f.Find(v, l, "health", 16);
    for (const char* w : {"row_mean 4096x4096", "row_mean 8192x8192"}) {
      const LoadPoint* one = f.Find(v, l, w, 1);
      const LoadPoint* p = f.Find(v, l, w, 16);
      if (one == nullptr || p == nullptr || health16 == nullptr || one->kernel_p50_us <= 0) continue;
      const double kernel_rate = 1e6 / one->kernel_p50_us;
      const double ceiling = std::min(kernel_rate, health16->req_per_s);
      AddTarget(rep, absl::StrCat(at, w, " c=16 >= 0.85x min(kernel rate, health c=16)"),
                absl::StrFormat("%.0f req/s = %.3fx of min(%.0f, %.0f)", p->req_per_s,
                                p->req_per_s / ceiling, kernel_rate, health16->req_per_s) +
                    RoundSpread(*p, *health16, kernel_rate),
                p->req_per_s >= 0.85 * ceiling);
    }
    // 2. The launch-bound shape against the floor at the same concurrency.
    for (int c : {16, 64}) {
      const LoadPoint* p = f.Find(v, l, "row_mean 10x2048", c);
      const LoadPoint* h = f.Find(v, l, "health", c);
      if (p == nullptr || h == nullptr) continue;
      AddTarget(rep, absl::StrCat(at, "row_mean 10x2048 c=", c, " >= 0.90x health c=", c),
                absl::StrFormat("%.0f vs %.0f req/s = %.3fx", p->req_per_s, h->req_per_s,
                                p->req_per_s / h->req_per_s) +
                    RoundSpread(*p, *h, std::numeric_limits<double>::infinity()),
                p->req_per_s >= 0.9 * h->req_per_s);
    }
    // 3. Concurrency 1 does not get slower.
    if (const LoadPoint *p = f.Find(v, l, "row_mean 4096x4096", 1), *h = f.Find(v, l, "health", 1);
        p != nullptr && h != nullptr) {
      const double overhead = p->p50_us - p->kernel_p50_us;
      AddTarget(rep, absl::StrCat(at, "c=1 Execute p50 - kernel <= 1.5x health p50"),
                absl::StrFormat("%.1f us vs 1.5 x %.1f us", overhead, h->p50_us),
                overhead <= 1.5 * h->p50_us);
    }
    // 5. Tail latency at c=64 against the floor's own tail.
    if (const LoadPoint *p = f.Find(v, l, "row_mean 10x2048", 64), *h = f.Find(v, l, "health", 64);
        p != nullptr && h != nullptr && p->p50_us > 0 && h->p50_us > 0) {
      const double tail = p->p99_us / p->p50_us, floor_tail = h->p99_us / h->p50_us;
      AddTarget(rep, absl::StrCat(at, "10x2048 c=64 p99/p50 <= 1.2x health's"),
                absl::StrFormat("%.2f vs 1.2 x %.2f", tail, floor_tail), tail <= 1.2 * floor_tail);
    }
  }
}

void PrintConcurrency(const ConcurrencyFigures& f, const std::string& csv_path) {
  if (!f.ran) {
    std::printf("\nconcurrency: not measured: %s\n", f.error.c_str());
    return;
  }
  if (f.channels == 1) {
    std::printf("\nservice under concurrent load (threads on one channel, blocking calls, "
                "stored inputs):\n");
  } else {
    std::printf("\nservice under concurrent load (threads on %d channels, each its own "
                "connection, blocking calls, stored inputs; no targets):\n", f.channels);
  }
  // A variant column only when servers were compared (--load_variant).
  int label = 0;
  for (const LoadPoint& p : f.points) label = std::max(label, static_cast<int>(p.variant.size()));
  if (label > 0) std::printf("  %-*s", label, "variant");
  std::printf("  %-5s %-20s %5s %10s %10s %10s %10s %11s %10s %10s %11s\n", "lanes",
              "workload", "conc", "req/s", "p50 us", "p99 us", "kernel us", "compute us",
              "server us", "queue us", "outside us");
  std::ofstream csv;
  if (!csv_path.empty()) {
    std::filesystem::create_directories(std::filesystem::path(csv_path).parent_path());
    csv.open(csv_path);
    csv << "lanes,workload,concurrency,requests,req_per_s,p50_us,p99_us,kernel_p50_us,"
           "compute_p50_us,server_p50_us,queue_p50_us,variant\n";
  }
  for (const LoadPoint& p : f.points) {
    // "outside": the client's p50 less the handler's own (health has no handler timing).
    const bool timed = p.server_p50_us > 0;
    if (label > 0) std::printf("  %-*s", label, p.variant.c_str());
    std::printf("  %-5d %-20s %5d %10.0f %10.1f %10.1f %10.1f %11.1f %10.1f %10.1f %11.1f\n",
                p.lanes, p.workload.c_str(), p.concurrency, p.req_per_s, p.p50_us, p.p99_us,
                p.kernel_p50_us, p.compute_p50_us, p.server_p50_us, p.queue_p50_us,
                timed ? p.p50_us - p.server_p50_us : 0.0);
    if (csv.is_open()) {
      csv << p.lanes << "," << p.workload << "," << p.concurrency << "," << p.requests << ","
          << p.req_per_s << "," << p.p50_us << "," << p.p99_us << "," << p.kernel_p50_us << ","
          << p.compute_p50_us << "," << p.server_p50_us << "," << p.queue_p50_us << "," << p.variant
          << "\n";
    }
  }
}

}  // namespace opserve::bench
