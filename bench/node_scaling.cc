// Node section 1, scaling: row_mean on a stored input (one copy on each device) and tiny inline
// row_mean, C clients per device, the whole-node server against N one-device servers, the
// series taking turns in short windows so drift reaches them all alike.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench::node_bench {
namespace {

// ---- Driving clients for a fixed time. ----

struct Tally {
  int64_t ok = 0;
  std::vector<double> latency_us, compute_us, kernel_us;
  std::map<std::string, int64_t> devices;  // ExecuteResponse.device
  int64_t misplaced = 0;                   // ran elsewhere than its stored input's device
  std::string error;
  void Merge(Tally&& o) {
    ok += o.ok;
    latency_us.insert(latency_us.end(), o.latency_us.begin(), o.latency_us.end());
    compute_us.insert(compute_us.end(), o.compute_us.begin(), o.compute_us.end());
    kernel_us.insert(kernel_us.end(), o.kernel_us.begin(), o.kernel_us.end());
    for (const auto& [d, n] : o.devices) devices[d] += n;
    misplaced += o.misplaced;
    if (error.empty()) error = std::move(o.error);
  }
};
using CallFn = std::function<void(int thread, Tally& t)>;

// One Execute into `t`; `want_device` non-empty: the device it must run on.
void ExecuteInto(client::Client& c, const v1::ExecuteRequest& req, const std::string& want_device,
                 Tally& t) {
  const auto t0 = Clock::now();
  auto resp = c.Execute(req);
  const double us = Us(Clock::now() - t0);
  if (!resp.ok()) {
    t.error = StatusText(resp.status());
    return;
  }
  ++t.ok;
  t.latency_us.push_back(us);
  t.compute_us.push_back(resp->timing().compute_us());
  if (resp->nodes_size() > 0) t.kernel_us.push_back(resp->nodes(0).kernel_us());
  ++t.devices[resp->device()];
  if (!want_device.empty() && resp->device() != want_device) ++t.misplaced;
}

constexpr double kWarmSeconds = 0.1;

// `threads` threads call back to back: a warm-up, then `seconds`. Calls that end after the
// warm-up count, into into[thread]; returns the seconds from the warm-up's end to the last end.
double Drive(int threads, double seconds, const CallFn& call, std::vector<Tally>& into) {
  const auto to_dur = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  std::atomic<bool> go{false};
  Clock::time_point from, until;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (;;) {
        Tally one;
        call(t, one);
        if (!one.error.empty() || Clock::now() >= from) {
          into[t].Merge(std::move(one));
          break;
        }
      }
      while (into[t].error.empty() && Clock::now() < until) call(t, into[t]);
    });
  }
  from = Clock::now() + to_dur(kWarmSeconds);
  until = from + to_dur(seconds);
  go.store(true, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  return std::chrono::duration<double>(Clock::now() - from).count();
}

struct SeriesFigures {
  std::string name;
  double wall_s = 0;
  std::vector<Tally> groups;  // per device group, over all windows
  std::vector<double> round_rps;
  double Rps() const {
    int64_t ok = 0;
    for (const Tally& t : groups) ok += t.ok;
    return wall_s > 0 ? ok / wall_s : 0;
  }
  double GroupRps(size_t g) const { return wall_s > 0 ? groups[g].ok / wall_s : 0; }
  std::string Error() const {
    for (const Tally& t : groups) {
      if (!t.error.empty()) return t.error;
    }
    return "";
  }
  Tally All() const {
    Tally a;
    for (Tally t : groups) a.Merge(std::move(t));
    return a;
  }
};

}  // namespace

std::string Node::Scaling(NodeServer& multi) {
  const int n = n_, clients = o_.clients;
  // One one-device server per device: CUDA_VISIBLE_DEVICES=i --device=cuda:0 (on the CPU, a
  // --device=cpu process each).
  std::deque<NodeServer> singles;
  for (int i = 0; i < n; ++i) {
    const std::string bin = cpu_ ? launch_.bin() : launch_.OneGpu(i);
    NodeServer& s = singles.emplace_back();
    if (std::string err = s.Open(bin, Args({cpu_ ? "--device=cpu" : "--device=cuda:0"}), 0);
        !err.empty()) {
      return absl::StrCat("one-device server ", i, ": ", err);
    }
  }
  const Gen stored{v1::FLOAT32, o_.stored_rows, o_.stored_cols, 101};
  const Gen tiny{v1::FLOAT32, o_.tiny_rows, o_.tiny_cols, 202};
  // The stored input: one copy on each device of the whole-node server, one in each process.
  std::vector<v1::ExecuteRequest> multi_stored(n);
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat("node_x", i);
    PutOutcome p = PutGen(*multi.stub, name, stored, multi.devices[i], false, false, Threads());
    if (!p.status.ok()) return absl::StrCat("PutTensor ", name, ": ", StatusText(p.status));
    if (p.info.device() != multi.devices[i]) {
      return absl::StrCat("PutTensor ", name, " with device ", multi.devices[i], " landed on ",
                          p.info.device());
    }
    multi_stored[i] = RowMeanOfStored(name);
    PutOutcome q = PutGen(*singles[i].stub, "node_x", stored, "", false, false, Threads());
    if (!q.status.ok()) return absl::StrCat("PutTensor on server ", i, ": ", StatusText(q.status));
  }
  const v1::ExecuteRequest single_stored = RowMeanOfStored("node_x");
  const v1::ExecuteRequest tiny_req = TinyRowMean(tiny);
  const int threads = n * clients;
  struct Series {
    std::string name;
    CallFn call;
  };
  std::vector<Series> series = {
      {"stored, N processes",
       [&](int t, Tally& r) { ExecuteInto(singles[t / clients].c(), single_stored, "", r); }},
      {"stored, one process",
       [&](int t, Tally& r) {
         const int g = t / clients;
         ExecuteInto(*multi.groups[g], multi_stored[g], multi.devices[g], r);
       }},
      {"tiny, N processes",
       [&](int t, Tally& r) { ExecuteInto(singles[t / clients].c(), tiny_req, "", r); }},
      {"tiny, one process",
       [&](int t, Tally& r) { ExecuteInto(*multi.groups[t / clients], tiny_req, "", r); }},
  };
  // Warm every channel and lane before the windows.
  for (const Series& s : series) {
    for (int t = 0; t < threads; t += std::max(1, clients / 4)) {
      for (int k = 0; k < 8; ++k) {
        Tally w;
        s.call(t, w);
        if (!w.error.empty()) return absl::StrCat(s.name, ": ", w.error);
      }
    }
  }
  std::vector<SeriesFigures> figs(series.size());
  for (size_t i = 0; i < series.size(); ++i) {
    figs[i].name = series[i].name;
    figs[i].groups.resize(n);
  }
  const int rounds = std::max(1, o_.rounds);
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < series.size(); ++k) {
      const size_t i = (k + round) % series.size();  // each series leads in turn
      std::vector<Tally> per_thread(threads);
      const double wall = Drive(threads, o_.seconds / rounds, series[i].call, per_thread);
      int64_t ok = 0;
      for (int t = 0; t < threads; ++t) {
        ok += per_thread[t].ok;
        figs[i].groups[t / clients].Merge(std::move(per_thread[t]));
      }
      figs[i].wall_s += wall;
      figs[i].round_rps.push_back(ok / wall);
      if (std::string e = figs[i].Error(); !e.empty()) return absl::StrCat(figs[i].name, ": ", e);
    }
  }
  absl::PrintF("  %d devices x %d clients, %d windows of %.2f s per series, taking turns\n", n,
              clients, rounds, o_.seconds / rounds);
  absl::PrintF("  %-22s %10s %-28s %9s %9s %10s %10s  %s\n", "series", "req/s", "per device",
              "p50 us", "p99 us", "kernel us", "compute us", "ran on");
  for (const SeriesFigures& f : figs) {
    std::vector<std::string> each;
    for (size_t g = 0; g < f.groups.size(); ++g) each.push_back(absl::StrFormat("%.0f", f.GroupRps(g)));
    const Tally a = f.All();
    std::vector<std::string> on;
    for (const auto& [d, c] : a.devices) on.push_back(absl::StrCat(d.empty() ? "?" : d, " ", c));
    absl::PrintF("  %-22s %10.0f %-28s %9.1f %9.1f %10.1f %10.1f  %s%s\n", f.name.c_str(), f.Rps(),
                absl::StrJoin(each, " + ").c_str(), Percentile(a.latency_us, 0.5),
                Percentile(a.latency_us, 0.99), Percentile(a.kernel_us, 0.5),
                Percentile(a.compute_us, 0.5), absl::StrJoin(on, ", ").c_str(),
                a.misplaced ? absl::StrCat(" (", a.misplaced, " not on their input's device)").c_str()
                            : "");
    AddRow("node", absl::StrCat(f.name.rfind("tiny", 0) == 0 ? tiny.Shape() : stored.Shape(), " c=",
                                clients, "/device"),
           "FLOAT32", absl::StrFormat("row_mean %s: %.0f req/s (p50 latency)", f.name, f.Rps()), false,
           static_cast<int>(a.latency_us.size()), Percentile(a.latency_us, 0.5), 0, 0);
  }
  auto spread = [&](const SeriesFigures& multi_f, const SeriesFigures& single_f) {
    std::vector<double> r;
    for (size_t i = 0; i < multi_f.round_rps.size() && i < single_f.round_rps.size(); ++i) {
      r.push_back(multi_f.round_rps[i] / single_f.round_rps[i]);
    }
    std::sort(r.begin(), r.end());
    return r.empty() ? std::string() : absl::StrFormat("; windows %.3f-%.3f", r.front(), r.back());
  };
  // The kernel-bound rate the stored workload could reach: each device back to back.
  const Tally one = figs[0].All();
  const double kernel_rate = n * 1e6 / std::max(1e-3, Percentile(one.kernel_us, 0.5));
  absl::PrintF("  predicted (stored): the N processes' %.0f req/s (kernel-bound ceiling N x 1/kernel "
              "= %.0f); measured one process %.0f\n",
              figs[0].Rps(), kernel_rate, figs[1].Rps());
  const int64_t misplaced = figs[1].All().misplaced;
  Perf(absl::StrFormat("node scaling: stored %s row_mean, one process >= %.2fx N processes",
                       stored.Shape(), kStoredScaling),
       absl::StrFormat("%.0f vs %.0f req/s = %.3fx", figs[1].Rps(), figs[0].Rps(),
                       figs[1].Rps() / figs[0].Rps()) +
           spread(figs[1], figs[0]) +
           (misplaced ? absl::StrCat("; ", misplaced, " ran off their input's device") : ""),
       figs[1].Rps() >= kStoredScaling * figs[0].Rps() && misplaced == 0);
  Perf(absl::StrFormat("node scaling: tiny %s inline row_mean, one process >= %.2fx N processes",
                       tiny.Shape(), kTinyScaling),
       absl::StrFormat("%.0f vs %.0f req/s = %.3fx", figs[3].Rps(), figs[2].Rps(),
                       figs[3].Rps() / figs[2].Rps()) +
           spread(figs[3], figs[2]),
       figs[3].Rps() >= kTinyScaling * figs[2].Rps());
  for (int i = 0; i < n; ++i) (void)multi.c().DeleteTensor(absl::StrCat("node_x", i));
  return "";
}

}  // namespace opserve::bench::node_bench
