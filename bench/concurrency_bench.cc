#include "bench/concurrency_bench.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/service_process.h"

namespace opserve::bench {
namespace {

struct Workload {
  const char* name;
  const char* shape;  // what --load_workloads names
  int64_t rows, cols;
};
// Target 1's two kernel-bound shapes and target 2's launch-bound one.
constexpr Workload kWorkloads[] = {
    {"row_mean 4096x4096", "4096x4096", 4096, 4096},
    {"row_mean 8192x8192", "8192x8192", 8192, 8192},
    {"row_mean 10x2048", "10x2048", 10, 2048},
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

// `threads` threads call `call` back to back until `seconds` pass; every call's figures go to
// `into`.
template <typename Call>
void Drive(int threads, double seconds, Call call, Samples* into, std::string* error) {
  std::vector<ThreadResult> results(threads);
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  Clock::time_point until;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (Clock::now() < until && results[t].error.empty()) call(results[t]);
    });
  }
  const auto start = Clock::now();
  until = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go.store(true, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  into->wall_s += std::chrono::duration<double>(Clock::now() - start).count();
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

// A point's time is cut into this many windows, and the points of one concurrency take turns
// window by window: the host's own slow spells (other tenants of a VM) then fall on the floor
// and on the workloads alike, instead of on whichever ran during them.
constexpr int kRounds = 6;

}  // namespace

const LoadPoint* ConcurrencyFigures::Find(int lanes, const std::string& workload,
                                          int concurrency) const {
  for (const LoadPoint& p : points) {
    if (p.lanes == lanes && p.workload == workload && p.concurrency == concurrency) return &p;
  }
  return nullptr;
}

ConcurrencyFigures RunConcurrencyBench(const ConcurrencyOptions& opt) {
  ConcurrencyFigures f;
  for (int lanes : opt.lanes) {
    std::vector<std::string> args = opt.server_args;
    args.push_back(absl::StrCat("--lanes=", lanes));
    Session session;  // its one client channel is shared by every thread
    if (std::string err = session.Open(opt.opserve_bin, args); !err.empty()) {
      f.error = err;
      return f;
    }
    client::Client& c = *session.client;
    grpc::GenericStub& raw = *session.raw;
    std::string error;

    // The floor first: blocking Health/Check calls made the same way, on one channel.
    struct Series {
      std::string name;
      std::function<void(ThreadResult&)> call;
    };
    std::vector<Series> series;
    series.push_back({"health", [&](ThreadResult& r) {
                        const auto t0 = Clock::now();
                        if (!RawHealthCheck(&raw)) r.error = "Health/Check failed";
                        r.latency_us.push_back(Us(Clock::now() - t0));
                      }});
    std::vector<v1::ExecuteRequest> requests;
    requests.reserve(std::size(kWorkloads));  // the calls below point into it
    std::vector<std::string> stored;
    for (const Workload& w : kWorkloads) {
      if (!opt.workloads.empty() && !opt.workloads.count(w.shape)) continue;
      const std::string x = RandomFloats(static_cast<uint64_t>(w.rows * w.cols));
      const int64_t shape[] = {w.rows, w.cols};
      const std::string name = absl::StrCat("load_", w.shape);
      auto put = c.PutTensor(name, v1::FLOAT32, shape, x.data(), x.size(), /*overwrite=*/true);
      if (!put.ok()) {
        f.error = absl::StrCat("PutTensor ", w.name, ": ", put.status().message());
        return f;
      }
      stored.push_back(name);
      const v1::ExecuteRequest& req = requests.emplace_back(RowMeanOfStored(name));
      auto execute = [&c, &req, w](ThreadResult& r) {
        const auto t0 = Clock::now();
        auto resp = c.Execute(req);
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
      for (int i = 0; i < 20; ++i) {  // warm: the first calls of a channel and a lane
        ThreadResult warm;
        execute(warm);
      }
      series.push_back({w.name, execute});
    }
    for (int conc : opt.concurrency) {
      std::vector<Samples> samples(series.size());
      for (int round = 0; round < kRounds && error.empty(); ++round) {
        for (size_t k = 0; k < series.size(); ++k) {
          const size_t i = (k + round) % series.size();  // each series leads in turn
          Drive(conc, opt.seconds / kRounds, series[i].call, &samples[i], &error);
        }
      }
      for (size_t i = 0; i < series.size(); ++i) {
        LoadPoint p = Summarize(samples[i]);
        p.lanes = lanes;
        p.concurrency = conc;
        p.workload = series[i].name;
        f.points.push_back(p);
      }
    }
    for (const std::string& name : stored) (void)c.DeleteTensor(name);
    if (!error.empty()) {
      f.error = error;
      return f;
    }
  }
  f.ran = true;
  return f;
}

void AddConcurrencyTargets(const ConcurrencyFigures& f, Report& rep) {
  if (!f.ran) return;
  std::vector<int> lanes;
  for (const LoadPoint& p : f.points) {
    if (std::find(lanes.begin(), lanes.end(), p.lanes) == lanes.end()) lanes.push_back(p.lanes);
  }
  for (int l : lanes) {
    const std::string at = absl::StrCat("load, ", l, l == 1 ? " lane: " : " lanes: ");
    // 1. Kernel-bound shapes at c=16: against the lower of the kernel-bound rate and the floor.
    const LoadPoint* health16 = f.Find(l, "health", 16);
    for (const char* w : {"row_mean 4096x4096", "row_mean 8192x8192"}) {
      const LoadPoint* one = f.Find(l, w, 1);
      const LoadPoint* p = f.Find(l, w, 16);
      if (one == nullptr || p == nullptr || health16 == nullptr || one->kernel_p50_us <= 0) continue;
      const double kernel_rate = 1e6 / one->kernel_p50_us;
      const double ceiling = std::min(kernel_rate, health16->req_per_s);
      AddTarget(rep, absl::StrCat(at, w, " c=16 >= 0.85x min(kernel rate, health c=16)"),
                absl::StrFormat("%.0f req/s = %.3fx of min(%.0f, %.0f)", p->req_per_s,
                                p->req_per_s / ceiling, kernel_rate, health16->req_per_s),
                p->req_per_s >= 0.85 * ceiling);
    }
    // 2. The launch-bound shape against the floor at the same concurrency.
    for (int c : {16, 64}) {
      const LoadPoint* p = f.Find(l, "row_mean 10x2048", c);
      const LoadPoint* h = f.Find(l, "health", c);
      if (p == nullptr || h == nullptr) continue;
      AddTarget(rep, absl::StrCat(at, "row_mean 10x2048 c=", c, " >= 0.90x health c=", c),
                absl::StrFormat("%.0f vs %.0f req/s = %.3fx", p->req_per_s, h->req_per_s,
                                p->req_per_s / h->req_per_s),
                p->req_per_s >= 0.9 * h->req_per_s);
    }
    // 3. Concurrency 1 does not get slower.
    if (const LoadPoint *p = f.Find(l, "row_mean 4096x4096", 1), *h = f.Find(l, "health", 1);
        p != nullptr && h != nullptr) {
      const double overhead = p->p50_us - p->kernel_p50_us;
      AddTarget(rep, absl::StrCat(at, "c=1 Execute p50 - kernel <= 1.5x health p50"),
                absl::StrFormat("%.1f us vs 1.5 x %.1f us", overhead, h->p50_us),
                overhead <= 1.5 * h->p50_us);
    }
    // 5. Tail latency at c=64 against the floor's own tail.
    if (const LoadPoint *p = f.Find(l, "row_mean 10x2048", 64), *h = f.Find(l, "health", 64);
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
  std::printf("\nservice under concurrent load (threads on one channel, blocking calls, stored "
              "inputs):\n");
  std::printf("  %-5s %-20s %5s %10s %10s %10s %10s %11s %10s %10s %11s\n", "lanes",
              "workload", "conc", "req/s", "p50 us", "p99 us", "kernel us", "compute us",
              "server us", "queue us", "outside us");
  std::ofstream csv;
  if (!csv_path.empty()) {
    std::filesystem::create_directories(std::filesystem::path(csv_path).parent_path());
    csv.open(csv_path);
    csv << "lanes,workload,concurrency,requests,req_per_s,p50_us,p99_us,kernel_p50_us,"
           "compute_p50_us,server_p50_us,queue_p50_us\n";
  }
  for (const LoadPoint& p : f.points) {
    // "outside": the client's p50 less the handler's own (health has no handler timing).
    const bool timed = p.server_p50_us > 0;
    std::printf("  %-5d %-20s %5d %10.0f %10.1f %10.1f %10.1f %11.1f %10.1f %10.1f %11.1f\n",
                p.lanes, p.workload.c_str(), p.concurrency, p.req_per_s, p.p50_us, p.p99_us,
                p.kernel_p50_us, p.compute_p50_us, p.server_p50_us, p.queue_p50_us,
                timed ? p.p50_us - p.server_p50_us : 0.0);
    if (csv.is_open()) {
      csv << p.lanes << "," << p.workload << "," << p.concurrency << "," << p.requests << ","
          << p.req_per_s << "," << p.p50_us << "," << p.p99_us << "," << p.kernel_p50_us << ","
          << p.compute_p50_us << "," << p.server_p50_us << "," << p.queue_p50_us << "\n";
    }
  }
}

}  // namespace opserve::bench
