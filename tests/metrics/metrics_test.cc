// Metrics: the families, labels and values that a scrape shows, the bounds on label cardinality,
// the series of several devices in one process, the HTTP exposer, and promtool's lint of a real
// scrape.
#include "server/engine/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

#ifndef OPSERVE_VERSION
#define OPSERVE_VERSION "unknown"
#endif

namespace opserve {
namespace {

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value;
};

// Parses the text exposition format well enough for what prometheus-cpp writes: one sample a
// line, `name{k="v",...} value`, label values with \\, \" and \n escapes.
std::vector<Sample> Parse(const std::string& text) {
  std::vector<Sample> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = line.find_first_of("{ ");
    s.name = line.substr(0, i);
    if (line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        const size_t eq = line.find('=', i);
        const std::string key = line.substr(i, eq - i);
        std::string value;
        for (i = eq + 2; line[i] != '"'; ++i) {
          if (line[i] == '\\') {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
        }
        s.labels[key] = value;
        ++i;  // closing quote
        if (line[i] == ',') ++i;
      }
      ++i;  // closing brace
    }
    s.value = std::stod(line.substr(i + 1));
    samples.push_back(std::move(s));
  }
  return samples;
}

// The value of the one sample with exactly these labels, or nullopt.
std::optional<double> Value(const std::string& text, const std::string& name,
                            const Labels& labels = {}) {
  for (const Sample& s : Parse(text)) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

int CountSeries(const std::string& text, const std::string& name) {
  int n = 0;
  for (const Sample& s : Parse(text)) n += s.name == name;
  return n;
}

// The RPC names the server's edge gives the metrics (server/rpc/server_core.h).
const std::vector<std::string> kRpcs = {"PutTensor", "GetTensor",  "DeleteTensor", "ListTensors",
                                        "Execute",   "ListOps",    "SaveGraph",    "DeleteGraph",
                                        "ListGraphs", "ModelInfer"};

std::unique_ptr<Metrics> MakeMetrics(const std::string& bind = "") {
  auto metrics = Metrics::Create(bind, "cpu", "cpu", kRpcs, kRpcs);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(*metrics) : nullptr;
}

TEST(MetricsTest, EveryFamilyIsExportedWithItsType) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  // No kernel series until a kernel ran or was declared (op and algorithm come from the server's
  // table, which metrics.cc does not know), and prometheus-cpp leaves a family without series
  // out of the scrape.
  EXPECT_EQ(CountSeries(metrics->Scrape(), "opserve_kernel_launches_total"), 0);
  metrics->RecordKernel("sum", "two_pass", 0.5, 4000, 1000);
  const std::string text = metrics->Scrape();
  const std::map<std::string, std::string> families = {
      {"opserve_kernel_seconds_total", "counter"},
      {"opserve_kernel_bytes_total", "counter"},
      {"opserve_kernel_flops_total", "counter"},
      {"opserve_kernel_launches_total", "counter"},
      {"opserve_requests_total", "counter"},
      {"opserve_request_duration_seconds", "histogram"},
      {"opserve_queue_duration_seconds", "histogram"},
      {"opserve_transfer_bytes_total", "counter"},
      {"opserve_device_memory_bytes", "gauge"},
      {"opserve_tensors", "gauge"},
      {"opserve_receive_buffer_bytes", "gauge"},
      {"opserve_inflight_requests", "gauge"},
      {"opserve_stream_unanswered_peak", "gauge"},
      {"opserve_stream_window_full_total", "counter"},
      {"opserve_build_info", "gauge"},
      {"opserve_graph_replays_total", "counter"},
      {"opserve_device_serving", "gauge"},
      {"opserve_device_queue_depth", "gauge"},
      {"opserve_peer_copy_bytes_total", "counter"},
      {"opserve_peer_copy_seconds_total", "counter"},
  };
  for (const auto& [name, type] : families) {
    EXPECT_NE(text.find("# TYPE " + name + " " + type + "\n"), std::string::npos) << name;
    EXPECT_NE(text.find("# HELP " + name + " "), std::string::npos) << name;
  }
  // Made at start-up, every code of every RPC named, so that rate() sees the first error of each.
  for (const std::string& rpc : kRpcs) {
    for (const char* code : {"OK", "CANCELLED", "INVALID_ARGUMENT", "NOT_FOUND", "INTERNAL",
                             "UNAVAILABLE", "UNAUTHENTICATED"}) {
      EXPECT_EQ(Value(text, "opserve_requests_total", {{"rpc", rpc}, {"code", code}}), 0)
          << rpc << " " << code;
    }
    EXPECT_EQ(Value(text, "opserve_request_duration_seconds_count", {{"rpc", rpc}}), 0) << rpc;
  }
  EXPECT_EQ(CountSeries(text, "opserve_requests_total"), 10 * 17);  // RPCs x gRPC codes
  EXPECT_EQ(Value(text, "opserve_transfer_bytes_total", {{"direction", "upload"}}), 0);
  EXPECT_EQ(Value(text, "opserve_transfer_bytes_total", {{"direction", "download"}}), 0);
  EXPECT_EQ(Value(text, "opserve_build_info", {{"version", OPSERVE_VERSION}, {"backend", "cpu"}}),
            1);
  EXPECT_EQ(Value(text, "opserve_inflight_requests"), 0);
  EXPECT_EQ(Value(text, "opserve_tensors", {{"device", "cpu"}}), 0);
  for (const char* state : {"in_use", "idle"}) {
    EXPECT_EQ(Value(text, "opserve_receive_buffer_bytes", {{"state", state}}), 0) << state;
  }
  for (const char* kind : {"used", "budget", "total"}) {
    EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cpu"}, {"kind", kind}}), 0);
  }
  EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", "cpu"}}), 1);
  EXPECT_EQ(Value(text, "opserve_device_queue_depth", {{"device", "cpu"}}), 0);
  EXPECT_EQ(Value(text, "opserve_peer_copy_bytes_total", {{"device", "cpu"}}), 0);
  EXPECT_EQ(Value(text, "opserve_peer_copy_seconds_total", {{"device", "cpu"}}), 0);
}

TEST(MetricsTest, KernelCountersAddUpPerOpAndAlgorithm) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->RecordKernel("sum", "two_pass", 0.5, 4000, 1000);
  metrics->RecordKernel("sum", "two_pass", 0.25, 2000, 500);
  metrics->RecordKernel("matmul", "tiled", 2.0, 12, 1'000'000'000'000ULL);
  const std::string text = metrics->Scrape();
  const Labels sum = {{"op", "sum"}, {"algorithm", "two_pass"}, {"device", "cpu"}};
  const Labels matmul = {{"op", "matmul"}, {"algorithm", "tiled"}, {"device", "cpu"}};
  EXPECT_EQ(Value(text, "opserve_kernel_seconds_total", sum), 0.75);
  EXPECT_EQ(Value(text, "opserve_kernel_bytes_total", sum), 6000);
  EXPECT_EQ(Value(text, "opserve_kernel_flops_total", sum), 1500);
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", sum), 2);
  EXPECT_EQ(Value(text, "opserve_kernel_seconds_total", matmul), 2.0);
  EXPECT_EQ(Value(text, "opserve_kernel_flops_total", matmul), 1e12);
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", matmul), 1);
  EXPECT_EQ(CountSeries(text, "opserve_kernel_launches_total"), 2);
}

// The server declares every (op, algorithm) of its backend's table at start-up: all four kernel
// families show each at 0 with the device label RecordKernel uses, before any launch, and a
// launch then adds to that same series.
TEST(MetricsTest, DeclaredKernelSeriesExistAtZeroBeforeTheFirstLaunch) {
  auto metrics = Metrics::Create("", "cuda:0", "cuda", kRpcs, kRpcs);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  (*metrics)->InitKernelSeries("sum", "two_pass");
  (*metrics)->InitKernelSeries("matmul", "tiled");
  (*metrics)->InitKernelSeries("sum", "two_pass");  // twice: still one series
  std::string text = (*metrics)->Scrape();
  const Labels sum = {{"op", "sum"}, {"algorithm", "two_pass"}, {"device", "cuda:0"}};
  const Labels matmul = {{"op", "matmul"}, {"algorithm", "tiled"}, {"device", "cuda:0"}};
  for (const char* family : {"opserve_kernel_seconds_total", "opserve_kernel_bytes_total",
                             "opserve_kernel_flops_total", "opserve_kernel_launches_total"}) {
    EXPECT_EQ(Value(text, family, sum), 0) << family;
    EXPECT_EQ(Value(text, family, matmul), 0) << family;
    EXPECT_EQ(CountSeries(text, family), 2) << family;
  }
  (*metrics)->RecordKernel("sum", "two_pass", 0.5, 4000, 1000);
  text = (*metrics)->Scrape();
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", sum), 1);
  EXPECT_EQ(Value(text, "opserve_kernel_bytes_total", sum), 4000);
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", matmul), 0);
  EXPECT_EQ(CountSeries(text, "opserve_kernel_launches_total"), 2);
}

TEST(MetricsTest, LaneSeriesExistAtZeroAndFollowTheirLane) {
  auto metrics = Metrics::Create("", "cuda:0", "cuda", kRpcs, kRpcs);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  (*metrics)->InitLanes(3);
  std::string text = (*metrics)->Scrape();
  EXPECT_NE(text.find("# TYPE opserve_lane_inflight gauge\n"), std::string::npos);
  EXPECT_EQ(CountSeries(text, "opserve_lane_inflight"), 3);
  const Labels lane1 = {{"device", "cuda:0"}, {"lane", "1"}};
  EXPECT_EQ(Value(text, "opserve_lane_inflight", lane1), 0);
  (*metrics)->SetLaneInflight(1, 2);
  (*metrics)->SetLaneInflight(7, 1);  // no such lane: ignored, no new series
  text = (*metrics)->Scrape();
  EXPECT_EQ(Value(text, "opserve_lane_inflight", lane1), 2);
  EXPECT_EQ(CountSeries(text, "opserve_lane_inflight"), 3);
}

TEST(MetricsTest, GraphReplaySeriesExistAtZeroAndCountTheirResult) {
  auto metrics = Metrics::Create("", "cuda:0", "cuda", kRpcs, kRpcs);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::string text = (*metrics)->Scrape();
  EXPECT_EQ(CountSeries(text, "opserve_graph_replays_total"), 4);
  const Labels hit = {{"device", "cuda:0"}, {"result", "hit"}};
  const Labels miss = {{"device", "cuda:0"}, {"result", "miss"}};
  EXPECT_EQ(Value(text, "opserve_graph_replays_total", hit), 0);
  (*metrics)->RecordGraph("hit");
  (*metrics)->RecordGraph("hit");
  (*metrics)->RecordGraph("miss");
  (*metrics)->RecordGraph("bogus");  // not a result: ignored, no new series
  text = (*metrics)->Scrape();
  EXPECT_EQ(Value(text, "opserve_graph_replays_total", hit), 2);
  EXPECT_EQ(Value(text, "opserve_graph_replays_total", miss), 1);
  EXPECT_EQ(CountSeries(text, "opserve_graph_replays_total"), 4);
}

TEST(MetricsTest, BadKernelTimeIsDroppedWithoutPoisoningTheCounter) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->RecordKernel("sum", "cub", 0.5, 8, 2);
  metrics->RecordKernel("sum", "cub", std::numeric_limits<double>::quiet_NaN(), 8, 2);
  metrics->RecordKernel("sum", "cub", -1.0, 8, 2);
  metrics->RecordKernel("sum", "cub", std::numeric_limits<double>::infinity(), 8, 2);
  const std::string text = metrics->Scrape();
  const Labels sum = {{"op", "sum"}, {"algorithm", "cub"}, {"device", "cpu"}};
  EXPECT_EQ(Value(text, "opserve_kernel_seconds_total", sum), 0.5);
  EXPECT_EQ(Value(text, "opserve_kernel_bytes_total", sum), 32);
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", sum), 4);
}

TEST(MetricsTest, RequestsAreCountedByRpcAndCanonicalCodeName) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.001);
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.002);
  metrics->RecordRequest("Execute", absl::StatusCode::kInvalidArgument, 0.0001);
  metrics->RecordRequest("PutTensor", absl::StatusCode::kResourceExhausted, 0.5);
  metrics->RecordRequest("GetTensor", absl::StatusCode::kNotFound, 0.5);
  metrics->RecordRequest("ListOps", static_cast<absl::StatusCode>(99), 0.5);  // not a code
  const std::string text = metrics->Scrape();
  const auto requests = [&](const char* rpc, const char* code) {
    return Value(text, "opserve_requests_total", {{"rpc", rpc}, {"code", code}});
  };
  EXPECT_EQ(requests("Execute", "OK"), 2);
  EXPECT_EQ(requests("Execute", "INVALID_ARGUMENT"), 1);
  EXPECT_EQ(requests("PutTensor", "RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(requests("GetTensor", "NOT_FOUND"), 1);
  EXPECT_EQ(requests("ListOps", "UNKNOWN"), 1);
  EXPECT_EQ(Value(text, "opserve_request_duration_seconds_count", {{"rpc", "Execute"}}), 3);
  EXPECT_NEAR(*Value(text, "opserve_request_duration_seconds_sum", {{"rpc", "Execute"}}), 0.0031,
              1e-12);
}

TEST(MetricsTest, HistogramBucketsAreExponentialFrom10usTo10s) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.00001);  // on the first bound
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.003);
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 60);  // past the last bound
  metrics->RecordQueue("Execute", 0.0002);
  std::vector<double> bounds;
  std::map<double, double> counts;
  std::map<double, double> queue_counts;
  for (const Sample& s : Parse(metrics->Scrape())) {
    if (s.labels.count("rpc") == 0 || s.labels.at("rpc") != "Execute") continue;
    if (s.name == "opserve_request_duration_seconds_bucket") {
      const double le = std::stod(s.labels.at("le"));  // stod reads "+Inf" as infinity
      bounds.push_back(le);
      counts[le] = s.value;
    } else if (s.name == "opserve_queue_duration_seconds_bucket") {
      queue_counts[std::stod(s.labels.at("le"))] = s.value;
    }
  }
  ASSERT_EQ(bounds.size(), 20u);  // 19 bounds, three a decade, and +Inf
  EXPECT_DOUBLE_EQ(bounds.front(), 1e-5);
  EXPECT_DOUBLE_EQ(bounds[18], 10.0);
  EXPECT_TRUE(std::isinf(bounds.back()));
  for (size_t i = 1; i + 1 < bounds.size(); ++i) {
    EXPECT_NEAR(bounds[i] / bounds[i - 1], std::cbrt(10.0), 0.01) << i;
  }
  EXPECT_EQ(counts[1e-5], 1);
  EXPECT_EQ(counts[0.00215], 1);
  EXPECT_EQ(counts[0.00464], 2);
  EXPECT_EQ(counts[10.0], 2);
  EXPECT_EQ(counts[std::numeric_limits<double>::infinity()], 3);
  EXPECT_EQ(queue_counts[0.0001], 0);
  EXPECT_EQ(queue_counts[0.000215], 1);
}

TEST(MetricsTest, TransferMemoryTensorsAndInflight) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  metrics->RecordTransfer("upload", 1 << 20);
  metrics->RecordTransfer("upload", 1 << 20);
  metrics->RecordTransfer("download", 7);
  metrics->SetMemory(3'000'000'000ULL, 60'000'000'000ULL, 80'000'000'000ULL);
  metrics->SetTensors(12);
  metrics->AddInflight(3);
  metrics->AddInflight(-1);
  const std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "opserve_transfer_bytes_total", {{"direction", "upload"}}), 2 << 20);
  EXPECT_EQ(Value(text, "opserve_transfer_bytes_total", {{"direction", "download"}}), 7);
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cpu"}, {"kind", "used"}}), 3e9);
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cpu"}, {"kind", "budget"}}),
            6e10);
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cpu"}, {"kind", "total"}}),
            8e10);
  EXPECT_EQ(Value(text, "opserve_tensors", {{"device", "cpu"}}), 12);
  EXPECT_EQ(Value(text, "opserve_inflight_requests"), 2);
}

// Request series for every RPC named, queue-time series only for those that queue.
TEST(MetricsTest, QueueSeriesOnlyForTheRpcsThatQueue) {
  const std::vector<std::string> queued = {"Execute"};
  auto metrics = Metrics::Create("", "cpu", "cpu", kRpcs, queued);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const std::string text = (*metrics)->Scrape();
  EXPECT_EQ(CountSeries(text, "opserve_request_duration_seconds_count"),
            static_cast<int>(kRpcs.size()));
  EXPECT_EQ(CountSeries(text, "opserve_queue_duration_seconds_count"), 1);
  EXPECT_EQ(Value(text, "opserve_queue_duration_seconds_count",
                  {{"rpc", "Execute"}, {"device", "cpu"}}),
            0);
}

// The streams' peak keeps the largest count any stream reported, from any thread; the window
// counter counts each time a stream stopped reading.
TEST(MetricsTest, StreamPeakIsTheLargestUnansweredCount) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  EXPECT_EQ(Value(metrics->Scrape(), "opserve_stream_unanswered_peak"), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 1; i <= 1000; ++i) metrics->RecordStreamUnanswered(i % (10 + t));
      metrics->RecordStreamWindowFull();
    });
  }
  for (std::thread& t : threads) t.join();
  metrics->RecordStreamUnanswered(3);
  const std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "opserve_stream_unanswered_peak"), 12);
  EXPECT_EQ(Value(text, "opserve_stream_window_full_total"), 4);
}

TEST(MetricsTest, DeviceLabelIsTheOneGivenToCreate) {
  auto metrics = Metrics::Create("", "cuda:0", "cuda", kRpcs, kRpcs);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  (*metrics)->RecordKernel("transpose", "tma", 1e-6, 8, 0);
  const std::string text = (*metrics)->Scrape();
  EXPECT_EQ(Value(text, "opserve_kernel_bytes_total",
                  {{"op", "transpose"}, {"algorithm", "tma"}, {"device", "cuda:0"}}),
            8);
  EXPECT_EQ(Value(text, "opserve_tensors", {{"device", "cuda:0"}}), 0);
  EXPECT_EQ(Value(text, "opserve_build_info", {{"version", OPSERVE_VERSION}, {"backend", "cuda"}}),
            1);
}

TEST(MetricsTest, LabelCardinalityIsBounded) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  for (int i = 0; i < 1000; ++i) {
    const std::string name = "bogus_" + std::to_string(i);
    metrics->RecordKernel(name, "auto", 1e-6, 1, 1);
    metrics->RecordRequest(name, absl::StatusCode::kUnimplemented, 1e-6);
    metrics->RecordQueue(name, 1e-6);
    metrics->RecordTransfer(name, 1);
  }
  const std::string text = metrics->Scrape();
  EXPECT_LE(CountSeries(text, "opserve_kernel_launches_total"), 257);
  EXPECT_LE(CountSeries(text, "opserve_request_duration_seconds_count"), 49);
  EXPECT_LE(CountSeries(text, "opserve_queue_duration_seconds_count"), 49);
  EXPECT_LE(CountSeries(text, "opserve_transfer_bytes_total"), 9);
  // Nothing is lost: what does not get its own series lands in "other".
  double launches = 0;
  for (const Sample& s : Parse(text)) {
    if (s.name == "opserve_kernel_launches_total") launches += s.value;
  }
  EXPECT_EQ(launches, 1000);
  EXPECT_GT(Value(text, "opserve_kernel_launches_total",
                  {{"op", "other"}, {"algorithm", "other"}, {"device", "cpu"}})
                .value_or(0),
            0);
  EXPECT_GT(Value(text, "opserve_requests_total", {{"rpc", "other"}, {"code", "UNIMPLEMENTED"}})
                .value_or(0),
            0);
}

TEST(MetricsTest, ConcurrentRecordingLosesNothing) {
  auto metrics = MakeMetrics();
  ASSERT_NE(metrics, nullptr);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string algorithm = t % 2 ? "odd" : "even";
      for (int i = 0; i < kPerThread; ++i) {
        metrics->RecordKernel("row_sum", algorithm, 0.001, 3, 1);
        metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.001);
        metrics->AddInflight(1);
        metrics->AddInflight(-1);
        if (i % 1000 == 0) metrics->Scrape();
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::string text = metrics->Scrape();
  for (const char* algorithm : {"odd", "even"}) {
    const Labels labels = {{"op", "row_sum"}, {"algorithm", algorithm}, {"device", "cpu"}};
    EXPECT_EQ(Value(text, "opserve_kernel_launches_total", labels), kThreads / 2 * kPerThread);
    EXPECT_EQ(Value(text, "opserve_kernel_bytes_total", labels), 3.0 * kThreads / 2 * kPerThread);
  }
  EXPECT_EQ(Value(text, "opserve_requests_total", {{"rpc", "Execute"}, {"code", "OK"}}),
            kThreads * kPerThread);
  EXPECT_EQ(Value(text, "opserve_inflight_requests"), 0);
}

// ---- Several devices in one process ----

const std::vector<std::string> kGpus = {"cuda:0", "cuda:1", "cuda:2"};

std::unique_ptr<Metrics> MakeDevices(const std::vector<std::string>& devices,
                                     const std::string& bind = "") {
  auto metrics = Metrics::Create(bind, devices, "cuda", kRpcs, kRpcs);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(*metrics) : nullptr;
}

// The families whose every series names its device, and those of the process, which name none.
const std::vector<std::string> kDeviceFamilies = {"opserve_kernel_seconds_total",
                                                  "opserve_kernel_bytes_total",
                                                  "opserve_kernel_flops_total",
                                                  "opserve_kernel_launches_total",
                                                  "opserve_queue_duration_seconds_bucket",
                                                  "opserve_queue_duration_seconds_count",
                                                  "opserve_queue_duration_seconds_sum",
                                                  "opserve_device_memory_bytes",
                                                  "opserve_tensors",
                                                  "opserve_lane_inflight",
                                                  "opserve_graph_replays_total",
                                                  "opserve_device_serving",
                                                  "opserve_device_queue_depth",
                                                  "opserve_peer_copy_bytes_total",
                                                  "opserve_peer_copy_seconds_total"};
const std::vector<std::string> kProcessFamilies = {"opserve_requests_total",
                                                   "opserve_request_duration_seconds_bucket",
                                                   "opserve_request_duration_seconds_count",
                                                   "opserve_request_duration_seconds_sum",
                                                   "opserve_transfer_bytes_total",
                                                   "opserve_receive_buffer_bytes",
                                                   "opserve_inflight_requests",
                                                   "opserve_stream_unanswered_peak",
                                                   "opserve_stream_window_full_total",
                                                   "opserve_build_info"};

// The samples of `name` on `device`.
std::vector<Sample> OnDevice(const std::string& text, const std::string& name,
                             const std::string& device) {
  std::vector<Sample> out;
  for (Sample& s : Parse(text)) {
    if (s.name == name && s.labels.count("device") && s.labels.at("device") == device) {
      out.push_back(std::move(s));
    }
  }
  return out;
}

TEST(MultiDeviceMetricsTest, EveryDeviceHasItsSeriesAtZeroFromTheStart) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  ASSERT_EQ(metrics->device_count(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(metrics->device(i).name(), kGpus[i]);
  const std::string text = metrics->Scrape();
  for (const std::string& device : kGpus) {
    for (const char* kind : {"used", "budget", "total"}) {
      EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", device}, {"kind", kind}}), 0)
          << device << " " << kind;
    }
    EXPECT_EQ(Value(text, "opserve_tensors", {{"device", device}}), 0) << device;
    EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", device}}), 1) << device;
    EXPECT_EQ(Value(text, "opserve_device_queue_depth", {{"device", device}}), 0) << device;
    EXPECT_EQ(Value(text, "opserve_peer_copy_bytes_total", {{"device", device}}), 0) << device;
    EXPECT_EQ(Value(text, "opserve_peer_copy_seconds_total", {{"device", device}}), 0) << device;
    for (const char* result : {"hit", "rebound", "miss", "direct"}) {
      EXPECT_EQ(
          Value(text, "opserve_graph_replays_total", {{"device", device}, {"result", result}}), 0)
          << device << " " << result;
    }
    for (const std::string& rpc : kRpcs) {
      EXPECT_EQ(
          Value(text, "opserve_queue_duration_seconds_count", {{"rpc", rpc}, {"device", device}}),
          0)
          << device << " " << rpc;
    }
  }
  // One series a device, no more: nothing labelled by another name slipped in.
  EXPECT_EQ(CountSeries(text, "opserve_device_memory_bytes"), 3 * 3);
  for (const char* family :
       {"opserve_tensors", "opserve_device_serving", "opserve_device_queue_depth",
        "opserve_peer_copy_bytes_total", "opserve_peer_copy_seconds_total"}) {
    EXPECT_EQ(CountSeries(text, family), 3) << family;
  }
  EXPECT_EQ(CountSeries(text, "opserve_graph_replays_total"), 3 * 4);
  EXPECT_EQ(CountSeries(text, "opserve_queue_duration_seconds_count"), 3 * 10);
  // The process's series stay one set, whatever the devices.
  EXPECT_EQ(CountSeries(text, "opserve_requests_total"), 10 * 17);
  EXPECT_EQ(CountSeries(text, "opserve_request_duration_seconds_count"), 10);
}

TEST(MultiDeviceMetricsTest, DeviceSeriesNameTheirDeviceAndProcessSeriesNone) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  for (int i = 0; i < 3; ++i) {
    metrics->device(i).InitKernelSeries("sum", "cub");
    metrics->device(i).InitLanes(2);
  }
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.01);
  metrics->RecordTransfer("upload", 8);
  std::map<std::string, std::set<std::string>> devices_seen;
  for (const Sample& s : Parse(metrics->Scrape())) {
    const bool device_family =
        std::find(kDeviceFamilies.begin(), kDeviceFamilies.end(), s.name) != kDeviceFamilies.end();
    const bool process_family = std::find(kProcessFamilies.begin(), kProcessFamilies.end(),
                                          s.name) != kProcessFamilies.end();
    ASSERT_TRUE(device_family || process_family) << "a family this test does not know: " << s.name;
    if (process_family) {
      EXPECT_EQ(s.labels.count("device"), 0u) << s.name;
      continue;
    }
    ASSERT_EQ(s.labels.count("device"), 1u) << s.name << " has no device label";
    devices_seen[s.name].insert(s.labels.at("device"));
  }
  for (const std::string& family : kDeviceFamilies) {
    EXPECT_EQ(devices_seen[family], std::set<std::string>(kGpus.begin(), kGpus.end())) << family;
  }
}

TEST(MultiDeviceMetricsTest, KernelOnOneDeviceLeavesTheOthersAtZero) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  for (int i = 0; i < 3; ++i) {
    metrics->device(i).InitKernelSeries("sum", "cub");
    metrics->device(i).InitKernelSeries("matmul", "tiled");
  }
  std::string text = metrics->Scrape();
  EXPECT_EQ(CountSeries(text, "opserve_kernel_launches_total"), 3 * 2);
  metrics->device(1).RecordKernel("sum", "cub", 0.5, 4000, 1000);
  metrics->device(1).RecordKernel("sum", "cub", 0.25, 2000, 500);
  metrics->device(2).RecordKernel("matmul", "tiled", 2.0, 12, 24);
  text = metrics->Scrape();
  const auto sum_on = [](const std::string& device) {
    return Labels{{"op", "sum"}, {"algorithm", "cub"}, {"device", device}};
  };
  EXPECT_EQ(Value(text, "opserve_kernel_seconds_total", sum_on("cuda:1")), 0.75);
  EXPECT_EQ(Value(text, "opserve_kernel_bytes_total", sum_on("cuda:1")), 6000);
  EXPECT_EQ(Value(text, "opserve_kernel_flops_total", sum_on("cuda:1")), 1500);
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", sum_on("cuda:1")), 2);
  for (const char* other : {"cuda:0", "cuda:2"}) {
    for (const char* family : {"opserve_kernel_seconds_total", "opserve_kernel_bytes_total",
                               "opserve_kernel_flops_total", "opserve_kernel_launches_total"}) {
      EXPECT_EQ(Value(text, family, sum_on(other)), 0) << family << " " << other;
    }
  }
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total",
                  {{"op", "matmul"}, {"algorithm", "tiled"}, {"device", "cuda:2"}}),
            1);
  for (const char* other : {"cuda:0", "cuda:1"}) {
    EXPECT_EQ(Value(text, "opserve_kernel_launches_total",
                    {{"op", "matmul"}, {"algorithm", "tiled"}, {"device", other}}),
              0)
        << other;
  }
  EXPECT_EQ(CountSeries(text, "opserve_kernel_launches_total"), 3 * 2);
}

TEST(MultiDeviceMetricsTest, GaugesAndCountersMoveOnlyOnTheirDevice) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  DeviceMetrics& d1 = metrics->device(1);
  d1.SetMemory(3'000'000'000ULL, 60'000'000'000ULL, 80'000'000'000ULL);
  d1.SetTensors(5);
  d1.SetQueueDepth(7);
  d1.RecordGraph("hit");
  d1.RecordQueue("Execute", 0.0002);
  metrics->device(2).InitLanes(2);
  metrics->device(2).SetLaneInflight(1, 3);
  const std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cuda:1"}, {"kind", "used"}}),
            3e9);
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cuda:1"}, {"kind", "budget"}}),
            6e10);
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cuda:1"}, {"kind", "total"}}),
            8e10);
  EXPECT_EQ(Value(text, "opserve_tensors", {{"device", "cuda:1"}}), 5);
  EXPECT_EQ(Value(text, "opserve_device_queue_depth", {{"device", "cuda:1"}}), 7);
  EXPECT_EQ(Value(text, "opserve_graph_replays_total", {{"device", "cuda:1"}, {"result", "hit"}}),
            1);
  EXPECT_EQ(Value(text, "opserve_queue_duration_seconds_count",
                  {{"rpc", "Execute"}, {"device", "cuda:1"}}),
            1);
  EXPECT_EQ(Value(text, "opserve_lane_inflight", {{"device", "cuda:2"}, {"lane", "1"}}), 3);
  EXPECT_EQ(CountSeries(text, "opserve_lane_inflight"), 2);  // only cuda:2 declared lanes
  for (const char* other : {"cuda:0", "cuda:2"}) {
    for (const char* kind : {"used", "budget", "total"}) {
      EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", other}, {"kind", kind}}), 0)
          << other << " " << kind;
    }
    EXPECT_EQ(Value(text, "opserve_tensors", {{"device", other}}), 0) << other;
    EXPECT_EQ(Value(text, "opserve_device_queue_depth", {{"device", other}}), 0) << other;
    EXPECT_EQ(Value(text, "opserve_graph_replays_total", {{"device", other}, {"result", "hit"}}), 0)
        << other;
    EXPECT_EQ(Value(text, "opserve_queue_duration_seconds_count",
                    {{"rpc", "Execute"}, {"device", other}}),
              0)
        << other;
  }
}

TEST(MultiDeviceMetricsTest, ServingFollowsSetServingPerDevice) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  metrics->device(1).SetServing(false);
  std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", "cuda:0"}}), 1);
  EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", "cuda:1"}}), 0);
  EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", "cuda:2"}}), 1);
  metrics->device(1).SetServing(true);
  metrics->device(2).SetServing(false);
  metrics->device(2).SetServing(false);  // twice: still 0, a gauge and not a count
  text = metrics->Scrape();
  EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", "cuda:1"}}), 1);
  EXPECT_EQ(Value(text, "opserve_device_serving", {{"device", "cuda:2"}}), 0);
  EXPECT_EQ(CountSeries(text, "opserve_device_serving"), 3);
}

TEST(MultiDeviceMetricsTest, PeerCopiesCountOnTheDestinationAndDropBadTimes) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  metrics->device(2).RecordPeerCopy(1 << 20, 0.001);
  metrics->device(2).RecordPeerCopy(1 << 20, 0.003);
  metrics->device(2).RecordPeerCopy(5, std::numeric_limits<double>::quiet_NaN());
  metrics->device(2).RecordPeerCopy(5, -1.0);
  metrics->device(0).RecordPeerCopy(64, 0.5);
  const std::string text = metrics->Scrape();
  EXPECT_EQ(Value(text, "opserve_peer_copy_bytes_total", {{"device", "cuda:2"}}), (2 << 20) + 10);
  EXPECT_NEAR(*Value(text, "opserve_peer_copy_seconds_total", {{"device", "cuda:2"}}), 0.004,
              1e-12);
  EXPECT_EQ(Value(text, "opserve_peer_copy_bytes_total", {{"device", "cuda:0"}}), 64);
  EXPECT_EQ(Value(text, "opserve_peer_copy_seconds_total", {{"device", "cuda:0"}}), 0.5);
  EXPECT_EQ(Value(text, "opserve_peer_copy_bytes_total", {{"device", "cuda:1"}}), 0);
  EXPECT_EQ(Value(text, "opserve_peer_copy_seconds_total", {{"device", "cuda:1"}}), 0);
}

// The methods of Metrics that predate several devices keep working, on the first device.
TEST(MultiDeviceMetricsTest, TheOneDeviceFormActsOnDeviceZero) {
  auto metrics = MakeDevices({"cpu:0", "cpu:1"});
  ASSERT_NE(metrics, nullptr);
  metrics->InitKernelSeries("sum", "two_pass");
  metrics->RecordKernel("sum", "two_pass", 0.5, 4000, 1000);
  metrics->RecordQueue("Execute", 0.001);
  metrics->SetMemory(1, 2, 3);
  metrics->SetTensors(4);
  metrics->InitLanes(1);
  metrics->SetLaneInflight(0, 1);
  metrics->RecordGraph("miss");
  const std::string text = metrics->Scrape();
  const Labels sum = {{"op", "sum"}, {"algorithm", "two_pass"}, {"device", "cpu:0"}};
  EXPECT_EQ(Value(text, "opserve_kernel_launches_total", sum), 1);
  EXPECT_EQ(CountSeries(text, "opserve_kernel_launches_total"), 1);
  EXPECT_EQ(Value(text, "opserve_queue_duration_seconds_count",
                  {{"rpc", "Execute"}, {"device", "cpu:0"}}),
            1);
  EXPECT_EQ(Value(text, "opserve_device_memory_bytes", {{"device", "cpu:0"}, {"kind", "budget"}}),
            2);
  EXPECT_EQ(Value(text, "opserve_tensors", {{"device", "cpu:0"}}), 4);
  EXPECT_EQ(Value(text, "opserve_lane_inflight", {{"device", "cpu:0"}, {"lane", "0"}}), 1);
  EXPECT_EQ(Value(text, "opserve_graph_replays_total", {{"device", "cpu:0"}, {"result", "miss"}}),
            1);
  EXPECT_EQ(Value(text, "opserve_queue_duration_seconds_count",
                  {{"rpc", "Execute"}, {"device", "cpu:1"}}),
            0);
  EXPECT_EQ(Value(text, "opserve_tensors", {{"device", "cpu:1"}}), 0);
  EXPECT_EQ(Value(text, "opserve_graph_replays_total", {{"device", "cpu:1"}, {"result", "miss"}}),
            0);
}

TEST(MultiDeviceMetricsTest, FindDeviceByName) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  ASSERT_NE(metrics->FindDevice("cuda:2"), nullptr);
  EXPECT_EQ(metrics->FindDevice("cuda:2"), &metrics->device(2));
  EXPECT_EQ(metrics->FindDevice("cuda:3"), nullptr);
  EXPECT_EQ(metrics->FindDevice("cuda"), nullptr);
}

TEST(MultiDeviceMetricsTest, BadDeviceListsAreInvalidArgumentNamingTheCulprit) {
  const std::vector<std::string> none;
  auto empty = Metrics::Create("", none, "cuda", kRpcs, kRpcs);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument) << empty.status();
  auto twice =
      Metrics::Create("", std::vector<std::string>{"cuda:0", "cuda:1", "cuda:0"}, "cuda", kRpcs, kRpcs);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument) << twice.status();
  EXPECT_NE(twice.status().message().find("'cuda:0'"), std::string::npos) << twice.status();
  auto unnamed = Metrics::Create("", std::vector<std::string>{"cpu:0", ""}, "cpu", kRpcs, kRpcs);
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument) << unnamed.status();
  EXPECT_NE(unnamed.status().message().find("device 1"), std::string::npos) << unnamed.status();
  // The one-device form keeps its old meaning for an empty name.
  auto unknown = Metrics::Create("", std::string(), "cpu", kRpcs, kRpcs);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(Value((*unknown)->Scrape(), "opserve_tensors", {{"device", "unknown"}}), 0);
}

TEST(MultiDeviceMetricsTest, KernelCardinalityIsBoundedPerDevice) {
  auto metrics = MakeDevices({"cuda:0", "cuda:1"});
  ASSERT_NE(metrics, nullptr);
  for (int i = 0; i < 600; ++i) {
    metrics->device(i % 2).RecordKernel("bogus_" + std::to_string(i), "auto", 1e-6, 1, 1);
  }
  const std::string text = metrics->Scrape();
  for (const char* device : {"cuda:0", "cuda:1"}) {
    const std::vector<Sample> launches = OnDevice(text, "opserve_kernel_launches_total", device);
    EXPECT_LE(launches.size(), 257u) << device;
    double total = 0;
    for (const Sample& s : launches) total += s.value;
    EXPECT_EQ(total, 300) << device;  // nothing lost: the rest lands in "other"
  }
}

TEST(MultiDeviceMetricsTest, DevicesRecordingAtOnceLoseNothing) {
  auto metrics = MakeDevices(kGpus);
  ASSERT_NE(metrics, nullptr);
  constexpr int kThreadsPerDevice = 3;
  constexpr int kPerThread = 4000;
  std::vector<std::thread> threads;
  for (int d = 0; d < 3; ++d) {
    for (int t = 0; t < kThreadsPerDevice; ++t) {
      threads.emplace_back([&, d] {
        DeviceMetrics& device = metrics->device(d);
        for (int i = 0; i < kPerThread; ++i) {
          device.RecordKernel("row_sum", "warp_per_row", 0.001, d + 1, 1);
          device.RecordPeerCopy(d + 1, 0.0);
          device.RecordQueue("Execute", 0.0001);
          if (i % 1000 == 0) metrics->Scrape();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  const std::string text = metrics->Scrape();
  constexpr double kPerDevice = kThreadsPerDevice * kPerThread;
  for (int d = 0; d < 3; ++d) {
    const Labels labels = {{"op", "row_sum"}, {"algorithm", "warp_per_row"}, {"device", kGpus[d]}};
    EXPECT_EQ(Value(text, "opserve_kernel_launches_total", labels), kPerDevice) << kGpus[d];
    EXPECT_EQ(Value(text, "opserve_kernel_bytes_total", labels), kPerDevice * (d + 1)) << kGpus[d];
    EXPECT_EQ(Value(text, "opserve_peer_copy_bytes_total", {{"device", kGpus[d]}}),
              kPerDevice * (d + 1))
        << kGpus[d];
    EXPECT_EQ(Value(text, "opserve_queue_duration_seconds_count",
                    {{"rpc", "Execute"}, {"device", kGpus[d]}}),
              kPerDevice)
        << kGpus[d];
  }
}

// ---- The HTTP exposer ----

// Binds 127.0.0.1:port (0: the kernel picks) and closes it again; the port it got, or 0.
int BindAndClose(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

// A port that was free a moment ago, for the exposer to take, from below the kernel's ephemeral
// range: a port inside it, once closed here, can become any process's outgoing source port
// before the exposer binds it (tests/support/e2e_script.py's free_port does the same).
int FreePort() {
  int low = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int i = 0; low >= 12000 && i < 100; ++i) {
    if (const int port = BindAndClose(std::uniform_int_distribution<int>(10000, low - 1)(rng))) {
      return port;
    }
  }
  return BindAndClose(0);
}

// GET http://127.0.0.1:port/path with HTTP/1.0; returns the body, or nullopt on a non-200.
std::optional<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return std::nullopt;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  send(fd, request.data(), request.size(), 0);
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) return std::nullopt;
  return response.substr(body + 4);
}

TEST(MetricsExposerTest, ServesTheScrapeOverHttp) {
  const int port = FreePort();
  auto metrics = MakeMetrics("127.0.0.1:" + std::to_string(port));
  ASSERT_NE(metrics, nullptr);
  metrics->RecordKernel("sum", "two_pass", 0.5, 4000, 1000);
  const std::optional<std::string> body = HttpGet(port, "/metrics");
  ASSERT_TRUE(body.has_value());
  EXPECT_EQ(Value(*body, "opserve_kernel_bytes_total",
                  {{"op", "sum"}, {"algorithm", "two_pass"}, {"device", "cpu"}}),
            4000);
  EXPECT_EQ(Value(*body, "opserve_build_info", {{"version", OPSERVE_VERSION}, {"backend", "cpu"}}),
            1);
}

TEST(MetricsExposerTest, TakenPortIsAStatusNotAnException) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto metrics = Metrics::Create("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), "cpu", "cpu", kRpcs, kRpcs);
  close(fd);
  EXPECT_FALSE(metrics.ok());
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kUnavailable) << metrics.status();
}

// `promtool check metrics` (Debian package `prometheus`) lints the exposition: naming, units,
// _total on counters, HELP text. CI installs it, so a missing promtool fails rather than skips.
TEST(MetricsExposerTest, PromtoolAcceptsARealScrape) {
  const int port = FreePort();
  auto metrics = MakeMetrics("127.0.0.1:" + std::to_string(port));
  ASSERT_NE(metrics, nullptr);
  metrics->RecordKernel("matmul", "tiled", 0.01, 3 * 4 * 1024 * 1024, 2ULL * 1024 * 1024 * 1024);
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.02);
  metrics->RecordRequest("Execute", absl::StatusCode::kInvalidArgument, 0.0001);
  metrics->RecordQueue("Execute", 0.0005);
  metrics->RecordTransfer("upload", 4096);
  metrics->SetMemory(1, 2, 3);
  metrics->SetTensors(1);
  const std::optional<std::string> body = HttpGet(port, "/metrics");
  ASSERT_TRUE(body.has_value());

  const std::filesystem::path dir = testing::TempDir();
  const std::filesystem::path scrape = dir / "opserve_scrape.txt";
  const std::filesystem::path out = dir / "opserve_promtool.txt";
  std::ofstream(scrape) << *body;
  const std::string command = "promtool check metrics < '" + scrape.string() + "' > '" +
                              out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(out);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 127) << "promtool not found: apt-get install prometheus";
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_EQ(output, "") << output;
}

// The same lint on a scrape of three devices with every device-level family written to.
TEST(MetricsExposerTest, PromtoolAcceptsAMultiDeviceScrape) {
  const int port = FreePort();
  auto metrics = MakeDevices(kGpus, "127.0.0.1:" + std::to_string(port));
  ASSERT_NE(metrics, nullptr);
  for (int d = 0; d < 3; ++d) {
    DeviceMetrics& device = metrics->device(d);
    device.InitKernelSeries("matmul", "tiled");
    device.InitLanes(2);
    device.RecordKernel("matmul", "tiled", 0.01, 1 << 20, 1 << 30);
    device.RecordQueue("Execute", 0.0005);
    device.SetMemory(1, 2, 3);
    device.SetTensors(1);
    device.SetLaneInflight(0, 1);
    device.RecordGraph("hit");
    device.RecordPeerCopy(1 << 20, 0.001);
    device.SetQueueDepth(2);
  }
  metrics->device(1).SetServing(false);
  metrics->RecordRequest("Execute", absl::StatusCode::kOk, 0.02);
  const std::optional<std::string> body = HttpGet(port, "/metrics");
  ASSERT_TRUE(body.has_value());
  EXPECT_EQ(Value(*body, "opserve_device_serving", {{"device", "cuda:1"}}), 0);

  const std::filesystem::path dir = testing::TempDir();
  const std::filesystem::path scrape = dir / "opserve_scrape_devices.txt";
  const std::filesystem::path out = dir / "opserve_promtool_devices.txt";
  std::ofstream(scrape) << *body;
  const std::string command =
      "promtool check metrics < '" + scrape.string() + "' > '" + out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(out);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 127) << "promtool not found: apt-get install prometheus";
  EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  EXPECT_EQ(output, "") << output;
}

}  // namespace
}  // namespace opserve
