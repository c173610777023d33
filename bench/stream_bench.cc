#include "bench/stream_bench.h"

#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/service_process.h"
#include "client/execute_stream.h"

namespace opserve::bench {
namespace {

constexpr int64_t kRows = 10, kCols = 2048;
// Each window opens with this long of calls that are not counted: the threads start and the
// thread pools settle after whatever ran before.
constexpr double kWindowWarmupSeconds = 0.1;

struct Series {
  std::string name;
  int in_flight;
  // Runs the series for one window: calls until `until`, latencies of those answered from
  // `from` on into `latencies`; "" or why it failed.
  std::function<std::string(Clock::time_point from, Clock::time_point until,
                            std::vector<double>* latencies)>
      window;
  std::vector<double> latency_us;
  double wall_s = 0;
  std::string error;
};

Series HealthSeries(grpc::ChannelInterface* channel, int threads) {
  return {absl::StrCat("health ", threads), threads,
          [channel, threads](Clock::time_point from, Clock::time_point until,
                             std::vector<double>* latencies) {
            std::mutex mu;
            std::string error;
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; ++t) {
              pool.emplace_back([&] {
                std::vector<double> mine;
                bool ok = true;
                while (ok && Clock::now() < until) {
                  const auto t0 = Clock::now();
                  ok = HealthCheck(channel);
                  const auto t1 = Clock::now();
                  if (t1 >= from) mine.push_back(Us(t1 - t0));
                }
                std::lock_guard lock(mu);
                latencies->insert(latencies->end(), mine.begin(), mine.end());
                if (!ok) error = "Health/Check failed";
              });
            }
            for (std::thread& t : pool) t.join();
            return error;
          }};
}

Series StreamSeries(client::Client& c, const v1::ExecuteRequest& req, int streams, int per_stream) {
  return {absl::StrCat("stream ", streams, "x", per_stream), streams * per_stream,
          [&c, &req, streams, per_stream](Clock::time_point from, Clock::time_point until,
                                          std::vector<double>* latencies) {
            std::mutex mu;
            std::string error;
            std::vector<std::thread> pool;
            for (int s = 0; s < streams; ++s) {
              pool.emplace_back([&] {
                std::vector<double> mine;  // the stream's reading thread alone adds to it
                std::string failed;
                const absl::Status st = client::DriveExecuteStream(
                    c, req, per_stream, [&] { return Clock::now() < until; },
                    [&](const client::StreamAnswer& a) {
                      if (a.response.has_status()) {
                        failed = a.response.status().message();
                      } else if (Clock::now() >= from) {
                        mine.push_back(a.latency_us);
                      }
                    });
                std::lock_guard lock(mu);
                latencies->insert(latencies->end(), mine.begin(), mine.end());
                if (!st.ok()) failed = st.ToString();
                if (!failed.empty()) error = absl::StrCat("ExecuteStream row_mean: ", failed);
              });
            }
            for (std::thread& t : pool) t.join();
            return error;
          }};
}

}  // namespace

const StreamPoint* StreamFigures::Find(const std::string& name) const {
  for (const StreamPoint& p : points) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

StreamFigures RunStreamBench(const StreamBenchOptions& opt) {
  StreamFigures f;
  Session session;
  if (std::string err = session.Open(opt.opserve_bin, opt.server_args); !err.empty()) {
    f.error = err;
    return f;
  }
  client::Client& c = *session.client;
  const std::string x = RandomFloats(kRows * kCols);
  const int64_t shape[] = {kRows, kCols};
  const std::string name = "stream_bench_10x2048";
  auto put = c.PutTensor(name, v1::FLOAT32, shape, x.data(), x.size(), /*overwrite=*/true);
  if (!put.ok()) {
    f.error = absl::StrCat("PutTensor: ", put.status().message());
    return f;
  }
  const v1::ExecuteRequest req = RowMeanOfStored(name);
  std::vector<Series> series;
  series.push_back(HealthSeries(session.raw_channel.get(), 64));
  series.push_back(StreamSeries(c, req, 16, 4));
  series.push_back(HealthSeries(session.raw_channel.get(), 16));
  series.push_back(StreamSeries(c, req, 4, 4));
  series.push_back(StreamSeries(c, req, 16, 1));
  const double window_s = opt.seconds / std::max(1, opt.rounds);
  const auto span = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  for (int round = 0; round < opt.rounds; ++round) {
    for (Series& s : series) {
      if (!s.error.empty()) continue;
      const Clock::time_point from = Clock::now() + span(kWindowWarmupSeconds);
      const Clock::time_point until = from + span(window_s);
      s.error = s.window(from, until, &s.latency_us);
      // The last answers come after `until`: the window is as long as its counted answers took.
      s.wall_s += std::chrono::duration<double>(Clock::now() - from).count();
    }
  }
  (void)c.DeleteTensor(name);
  for (const Series& s : series) {
    if (!s.error.empty() && f.error.empty()) f.error = s.error;
    StreamPoint p;
    p.name = s.name;
    p.in_flight = s.in_flight;
    p.requests = static_cast<int64_t>(s.latency_us.size());
    p.req_per_s = s.wall_s > 0 ? p.requests / s.wall_s : 0;
    p.p50_us = Percentile(s.latency_us, 0.5);
    p.p99_us = Percentile(s.latency_us, 0.99);
    f.points.push_back(p);
  }
  f.ran = f.error.empty();
  return f;
}

void PrintStream(const StreamFigures& f) {
  if (!f.error.empty()) std::printf("  stream section failed: %s\n", f.error.c_str());
  std::printf("  %-12s %9s %10s %12s %10s %10s\n", "series", "in flight", "requests", "req/s",
              "p50_us", "p99_us");
  for (const StreamPoint& p : f.points) {
    std::printf("  %-12s %9d %10lld %12.0f %10.1f %10.1f\n", p.name.c_str(), p.in_flight,
                static_cast<long long>(p.requests), p.req_per_s, p.p50_us, p.p99_us);
  }
  std::fflush(stdout);
}

void AddStreamTargets(const StreamFigures& f, Report& rep) {
  if (!f.ran) return;
  const auto target = [&](const std::string& stream, const std::string& health,
                          const std::string& what) {
    const StreamPoint* s = f.Find(stream);
    const StreamPoint* h = f.Find(health);
    if (s == nullptr || h == nullptr) return;
    AddTarget(rep, what,
              absl::StrFormat("%.0f vs 1.5 x %.0f req/s (%.2fx)", s->req_per_s, h->req_per_s,
                              h->req_per_s > 0 ? s->req_per_s / h->req_per_s : 0),
              s->req_per_s >= 1.5 * h->req_per_s);
  };
  target("stream 16x4", "health 64",
         "stream: 10x2048 row_mean, 64 in flight (16 streams x 4) >= 1.5x Health/Check at 64");
  target("stream 4x4", "health 16",
         "stream: 10x2048 row_mean, 16 in flight (4 streams x 4) >= 1.5x Health/Check at 16");
}

}  // namespace opserve::bench
