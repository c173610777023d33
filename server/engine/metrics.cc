// Prometheus metrics through prometheus-cpp. Every family is built once, in Create; label children
// are made at start-up (every RPC and code, every kernel the server declares) or on first use,
// and cached, so the hot paths (RecordKernel runs once per node) do a hash lookup under a short
// mutex and a few atomic adds, never a Family::Add.
#include "server/engine/metrics.h"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

#ifndef OPSERVE_VERSION
#define OPSERVE_VERSION "unknown"
#endif

namespace opserve {
namespace {

constexpr std::array<std::string_view, 2> kDirections = {"upload", "download"};
constexpr std::array<std::string_view, 4> kGraphResults = {"hit", "rebound", "miss", "direct"};

// Labels come from the server's fixed tables, but a bug there must not turn into unbounded
// cardinality: past these limits new values are folded into kOverflowLabel.
constexpr size_t kMaxRpcs = 32;
constexpr size_t kMaxKernelSeries = 256;  // (op, algorithm) pairs; the table has about 30
constexpr size_t kMaxDirections = 8;
constexpr std::string_view kOverflowLabel = "other";
static_assert(kDirections.size() < kMaxDirections);

// gRPC's codes are 0 (OK) .. 16 (UNAUTHENTICATED); absl::StatusCode uses the same numbers.
constexpr int kNumCodes = 17;

// 10 us .. 10 s, three buckets a decade (1, 2.15, 4.64 x 10^k): 19 bounds. The bounds are rounded
// to three significant digits so that the `le` labels stay readable in PromQL and Grafana.
std::vector<double> LatencyBuckets() {
  constexpr int kFirstDecade = -5;  // 10 us
  constexpr int kLastDecade = 1;    // 10 s
  constexpr int kPerDecade = 3;
  std::vector<double> bounds;
  for (int i = 0; i <= (kLastDecade - kFirstDecade) * kPerDecade; ++i) {
    const double exact = std::pow(10.0, kFirstDecade + static_cast<double>(i) / kPerDecade);
    // Through decimal text, so that a bound is the double nearest "2.15e-05", as a literal is.
    char text[32];
    std::snprintf(text, sizeof(text), "%.3g", exact);
    bounds.push_back(std::strtod(text, nullptr));
  }
  return bounds;
}

std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  return name.empty() ? "UNKNOWN" : name;
}

int CodeIndex(absl::StatusCode code) {
  const int i = static_cast<int>(code);
  return i >= 0 && i < kNumCodes ? i : static_cast<int>(absl::StatusCode::kUnknown);
}

// Counters only go up and a NaN would stick for the life of the process.
bool Usable(double v) { return std::isfinite(v) && v >= 0; }

// Heterogeneous lookup (C++20) keyed by string_view: the hot path allocates nothing.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct KernelKeyView {
  std::string_view op;
  std::string_view algorithm;
};
struct KernelKey {
  std::string op;
  std::string algorithm;
};
struct KernelKeyHash {
  using is_transparent = void;
  size_t operator()(KernelKeyView k) const noexcept {
    const size_t h = StringHash{}(k.op);
    return h ^ (StringHash{}(k.algorithm) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  }
  size_t operator()(const KernelKey& k) const noexcept {
    return (*this)(KernelKeyView{k.op, k.algorithm});
  }
};
struct KernelKeyEq {
  using is_transparent = void;
  static KernelKeyView View(KernelKeyView k) { return k; }
  static KernelKeyView View(const KernelKey& k) { return {k.op, k.algorithm}; }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const noexcept {
    return View(a).op == View(b).op && View(a).algorithm == View(b).algorithm;
  }
};

struct KernelSeries {
  prometheus::Counter* seconds;
  prometheus::Counter* bytes;
  prometheus::Counter* flops;
  prometheus::Counter* launches;
};

struct RpcSeries {
  prometheus::Histogram* duration;
  prometheus::Histogram* queue;
  std::array<prometheus::Counter*, kNumCodes> requests{};  // by code, made on first use
};

}  // namespace

struct Metrics::Impl {
  std::string device;
  std::vector<double> buckets = LatencyBuckets();
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

  // Families: owned by the registry, built once in Build().
  prometheus::Family<prometheus::Counter>* kernel_seconds = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_bytes = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_flops = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_launches = nullptr;
  prometheus::Family<prometheus::Counter>* requests = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration = nullptr;
  prometheus::Family<prometheus::Histogram>* queue_duration = nullptr;
  prometheus::Family<prometheus::Counter>* transfer_bytes = nullptr;

  // Children that never change label values.
  prometheus::Gauge* memory_used = nullptr;
  prometheus::Gauge* memory_budget = nullptr;
  prometheus::Gauge* memory_total = nullptr;
  prometheus::Gauge* tensors = nullptr;
  prometheus::Gauge* receive_in_use = nullptr;
  prometheus::Gauge* receive_idle = nullptr;
  prometheus::Gauge* inflight = nullptr;
  prometheus::Family<prometheus::Gauge>* lane_inflight = nullptr;
  std::vector<prometheus::Gauge*> lanes;  // written once by InitLanes, before the lanes start
  prometheus::Counter* graph_results[kGraphResults.size()] = {};

  // Caches of lazily made children. The pointers stay valid: families never drop children.
  std::mutex mu;
  std::unordered_map<KernelKey, KernelSeries, KernelKeyHash, KernelKeyEq> kernels;
  std::unordered_map<std::string, RpcSeries, StringHash, std::equal_to<>> rpcs;
  std::unordered_map<std::string, prometheus::Counter*, StringHash, std::equal_to<>> directions;

  // Declared last so that it is destroyed first: no scrape can run into a half-destroyed Impl.
  std::unique_ptr<prometheus::Exposer> exposer;

  void Build(const std::string& backend, std::span<const std::string> rpcs);
  KernelSeries& Kernel(std::string_view op, std::string_view algorithm);  // requires mu
  // The entry's key is the label actually used ("other" once the bound is reached).
  std::pair<const std::string, RpcSeries>& Rpc(std::string_view rpc);      // requires mu
  prometheus::Counter* Requests(std::pair<const std::string, RpcSeries>& entry,
                                absl::StatusCode code);  // requires mu
  prometheus::Counter* Direction(std::string_view direction);  // requires mu
};

void Metrics::Impl::Build(const std::string& backend, std::span<const std::string> rpcs) {
  kernel_seconds = &prometheus::BuildCounter()
                        .Name("opserve_kernel_seconds_total")
                        .Help("Kernel time of executed nodes, from device events (CPU: wall time).")
                        .Register(*registry);
  kernel_bytes = &prometheus::BuildCounter()
                      .Name("opserve_kernel_bytes_total")
                      .Help("Bytes executed nodes had to read and write, at the minimum the op needs.")
                      .Register(*registry);
  kernel_flops = &prometheus::BuildCounter()
                      .Name("opserve_kernel_flops_total")
                      .Help("Floating-point operations of executed nodes.")
                      .Register(*registry);
  kernel_launches = &prometheus::BuildCounter()
                         .Name("opserve_kernel_launches_total")
                         .Help("Executed nodes, one per kernel launch of an op.")
                         .Register(*registry);
  requests = &prometheus::BuildCounter()
                  .Name("opserve_requests_total")
                  .Help("Finished RPCs by method and gRPC status code.")
                  .Register(*registry);
  request_duration = &prometheus::BuildHistogram()
                          .Name("opserve_request_duration_seconds")
                          .Help("RPC time from the handler's receipt to the response.")
                          .Register(*registry);
  queue_duration = &prometheus::BuildHistogram()
                        .Name("opserve_queue_duration_seconds")
                        .Help("Time requests waited for the device worker.")
                        .Register(*registry);
  transfer_bytes = &prometheus::BuildCounter()
                        .Name("opserve_transfer_bytes_total")
                        .Help("Tensor bytes moved between clients and the server.")
                        .Register(*registry);

  auto& memory = prometheus::BuildGauge()
                     .Name("opserve_device_memory_bytes")
                     .Help("Device memory: used by stored and in-flight tensors, the server's "
                           "budget, and the device's total.")
                     .Register(*registry);
  memory_used = &memory.Add({{"device", device}, {"kind", "used"}});
  memory_budget = &memory.Add({{"device", device}, {"kind", "budget"}});
  memory_total = &memory.Add({{"device", device}, {"kind", "total"}});
  tensors = &prometheus::BuildGauge()
                 .Name("opserve_tensors")
                 .Help("Tensors stored on the device.")
                 .Register(*registry)
                 .Add({{"device", device}});
  auto& receive = prometheus::BuildGauge()
                      .Name("opserve_receive_buffer_bytes")
                      .Help("Host blocks the tensor bytes of a request are received into when they "
                            "are 1 MiB or more (ModelInfer raw_input_contents, Execute inline "
                            "data): in use by requests, and idle, kept mapped for the next.")
                      .Register(*registry);
  receive_in_use = &receive.Add({{"state", "in_use"}});
  receive_idle = &receive.Add({{"state", "idle"}});
  inflight = &prometheus::BuildGauge()
                  .Name("opserve_inflight_requests")
                  .Help("RPCs being handled now.")
                  .Register(*registry)
                  .Add({});
  lane_inflight = &prometheus::BuildGauge()
                       .Name("opserve_lane_inflight")
                       .Help("Requests in flight on a device lane now: 0 to its execution "
                             "contexts (--lane_contexts), those launched behind the one the "
                             "device runs included.")
                       .Register(*registry);
  auto& graphs = prometheus::BuildCounter()
                     .Name("opserve_graph_replays_total")
                     .Help("Execute and ModelInfer requests on a device with a graph cache by how "
                           "their kernels ran: hit (a cached CUDA graph replayed), rebound "
                           "(replayed after an update to the request's tensors), miss (captured "
                           "now), direct (node by node: kernels a graph cannot capture, or "
                           "intermediates over the budget).")
                     .Register(*registry);
  for (size_t i = 0; i < kGraphResults.size(); ++i) {
    graph_results[i] = &graphs.Add({{"device", device}, {"result", std::string(kGraphResults[i])}});
  }
  prometheus::BuildGauge()
      .Name("opserve_build_info")
      .Help("Always 1; the labels tell the version and the backend.")
      .Register(*registry)
      .Add({{"version", OPSERVE_VERSION}, {"backend", backend}})
      .Set(1);

  const std::lock_guard<std::mutex> lock(mu);
  // Every code of every RPC the edge names: a series first seen at 1 hides its first increase
  // from rate(), so a lone INTERNAL would never reach the error ratio. The server names 10 RPCs:
  // 10 x 17 series, no more.
  for (std::string_view rpc : rpcs) {
    auto& entry = Rpc(rpc);
    for (int code = 0; code < kNumCodes; ++code) {
      Requests(entry, static_cast<absl::StatusCode>(code));
    }
  }
  for (std::string_view direction : kDirections) Direction(direction);
}

KernelSeries& Metrics::Impl::Kernel(std::string_view op, std::string_view algorithm) {
  if (auto it = kernels.find(KernelKeyView{op, algorithm}); it != kernels.end()) return it->second;
  if (kernels.size() >= kMaxKernelSeries) {
    op = kOverflowLabel;
    algorithm = kOverflowLabel;
    if (auto it = kernels.find(KernelKeyView{op, algorithm}); it != kernels.end()) {
      return it->second;
    }
  }
  const prometheus::Labels labels = {
      {"op", std::string(op)}, {"algorithm", std::string(algorithm)}, {"device", device}};
  KernelSeries series = {&kernel_seconds->Add(labels), &kernel_bytes->Add(labels),
                         &kernel_flops->Add(labels), &kernel_launches->Add(labels)};
  return kernels.emplace(KernelKey{std::string(op), std::string(algorithm)}, series).first->second;
}

std::pair<const std::string, RpcSeries>& Metrics::Impl::Rpc(std::string_view rpc) {
  if (auto it = rpcs.find(rpc); it != rpcs.end()) return *it;
  if (rpcs.size() >= kMaxRpcs) {
    rpc = kOverflowLabel;
    if (auto it = rpcs.find(rpc); it != rpcs.end()) return *it;
  }
  const prometheus::Labels labels = {{"rpc", std::string(rpc)}};
  RpcSeries series;
  series.duration = &request_duration->Add(labels, buckets);
  series.queue = &queue_duration->Add(labels, buckets);
  return *rpcs.emplace(std::string(rpc), series).first;
}

prometheus::Counter* Metrics::Impl::Requests(std::pair<const std::string, RpcSeries>& entry,
                                             absl::StatusCode code) {
  const int i = CodeIndex(code);
  prometheus::Counter*& counter = entry.second.requests[i];
  if (counter == nullptr) {
    counter = &requests->Add(
        {{"rpc", entry.first}, {"code", CodeName(static_cast<absl::StatusCode>(i))}});
  }
  return counter;
}

prometheus::Counter* Metrics::Impl::Direction(std::string_view direction) {
  if (auto it = directions.find(direction); it != directions.end()) return it->second;
  if (directions.size() >= kMaxDirections) {
    direction = kOverflowLabel;
    if (auto it = directions.find(direction); it != directions.end()) return it->second;
  }
  prometheus::Counter* counter = &transfer_bytes->Add({{"direction", std::string(direction)}});
  directions.emplace(std::string(direction), counter);
  return counter;
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& bind_address,
                                                         const std::string& device,
                                                         const std::string& backend,
                                                         std::span<const std::string> rpcs) {
  auto impl = std::make_unique<Impl>();
  // An empty label value is the same as no label in PromQL, which would break joins on device.
  impl->device = device.empty() ? "unknown" : device;
  try {
    impl->Build(backend.empty() ? "unknown" : backend, rpcs);
  } catch (const std::exception& e) {
    // prometheus-cpp throws on invalid names; ours are literals, so this is a programming error,
    // but the server still gets a Status rather than an exception.
    return absl::InternalError(std::string("building metric families: ") + e.what());
  }
  if (!bind_address.empty()) {
    try {
      impl->exposer = std::make_unique<prometheus::Exposer>(bind_address);
    } catch (const std::exception& e) {
      // civetweb throws when the address does not parse or the port is taken.
      return absl::UnavailableError("serving metrics on " + bind_address + ": " + e.what());
    }
    impl->exposer->RegisterCollectable(impl->registry);
    // With port 0 civetweb picks one: say which, as the server does for its gRPC port.
    for (const int port : impl->exposer->GetListeningPorts()) {
      std::cerr << "opserve: metrics on port " << port << " at /metrics" << std::endl;
    }
  }
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Metrics::~Metrics() = default;

void Metrics::InitKernelSeries(std::string_view op, std::string_view algorithm) {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->Kernel(op, algorithm);  // made at 0, or already there
}

void Metrics::RecordKernel(std::string_view op, std::string_view algorithm, double seconds,
                           uint64_t bytes, uint64_t flops) {
  KernelSeries series;
  {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    series = impl_->Kernel(op, algorithm);
  }
  // Counter increments are atomic: no lock needed from here on.
  if (Usable(seconds)) series.seconds->Increment(seconds);
  series.bytes->Increment(static_cast<double>(bytes));
  series.flops->Increment(static_cast<double>(flops));
  series.launches->Increment();
}

void Metrics::RecordRequest(std::string_view rpc, absl::StatusCode code, double seconds) {
  prometheus::Counter* counter;
  prometheus::Histogram* duration;
  {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    auto& entry = impl_->Rpc(rpc);
    counter = impl_->Requests(entry, code);
    duration = entry.second.duration;
  }
  counter->Increment();
  if (Usable(seconds)) duration->Observe(seconds);
}

void Metrics::RecordQueue(std::string_view rpc, double seconds) {
  if (!Usable(seconds)) return;
  prometheus::Histogram* queue;
  {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    queue = impl_->Rpc(rpc).second.queue;
  }
  queue->Observe(seconds);
}

void Metrics::RecordTransfer(std::string_view direction, uint64_t bytes) {
  prometheus::Counter* counter;
  {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    counter = impl_->Direction(direction);
  }
  counter->Increment(static_cast<double>(bytes));
}

void Metrics::SetMemory(uint64_t used, uint64_t budget, uint64_t total) {
  impl_->memory_used->Set(static_cast<double>(used));
  impl_->memory_budget->Set(static_cast<double>(budget));
  impl_->memory_total->Set(static_cast<double>(total));
}

void Metrics::SetTensors(int64_t count) { impl_->tensors->Set(static_cast<double>(count)); }

void Metrics::SetReceiveBuffers(uint64_t in_use_bytes, uint64_t idle_bytes) {
  impl_->receive_in_use->Set(static_cast<double>(in_use_bytes));
  impl_->receive_idle->Set(static_cast<double>(idle_bytes));
}

void Metrics::InitLanes(int lanes) {
  for (int lane = static_cast<int>(impl_->lanes.size()); lane < lanes; ++lane) {
    impl_->lanes.push_back(
        &impl_->lane_inflight->Add({{"device", impl_->device}, {"lane", std::to_string(lane)}}));
  }
}

void Metrics::RecordGraph(std::string_view result) {
  for (size_t i = 0; i < kGraphResults.size(); ++i) {
    if (kGraphResults[i] == result) impl_->graph_results[i]->Increment();
  }
}

void Metrics::SetLaneInflight(int lane, int running) {
  if (lane >= 0 && lane < static_cast<int>(impl_->lanes.size())) {
    impl_->lanes[lane]->Set(running);
  }
}

void Metrics::AddInflight(int64_t delta) {
  if (delta >= 0) {
    impl_->inflight->Increment(static_cast<double>(delta));
  } else {
    impl_->inflight->Decrement(-static_cast<double>(delta));
  }
}

std::string Metrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace opserve
