// Prometheus metrics through prometheus-cpp. Every family is built once, in Create; label children
// are made at start-up (every RPC and code, every device's gauges, every kernel the server
// declares) or on first use, and cached, so the hot paths (RecordKernel runs once per node) do a
// hash lookup under a short mutex and a few atomic adds, never a Family::Add. Each device has its
// own caches and mutex: devices recording at once do not wait on each other.
#include "server/engine/metrics.h"

#include <array>
#include <atomic>
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
constexpr size_t kMaxRpcs = 48;  // the two services have 30
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
  std::array<prometheus::Counter*, kNumCodes> requests{};  // by code, made on first use
};

// The families whose series carry a device label. Built once by Metrics, shared by its devices;
// owned by the registry.
struct DeviceFamilies {
  prometheus::Family<prometheus::Counter>* kernel_seconds = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_bytes = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_flops = nullptr;
  prometheus::Family<prometheus::Counter>* kernel_launches = nullptr;
  prometheus::Family<prometheus::Histogram>* queue_duration = nullptr;
  prometheus::Family<prometheus::Gauge>* memory = nullptr;
  prometheus::Family<prometheus::Gauge>* tensors = nullptr;
  prometheus::Family<prometheus::Gauge>* lane_inflight = nullptr;
  prometheus::Family<prometheus::Counter>* graph_replays = nullptr;
  prometheus::Family<prometheus::Gauge>* serving = nullptr;
  prometheus::Family<prometheus::Gauge>* queue_depth = nullptr;
  prometheus::Family<prometheus::Counter>* peer_copy_bytes = nullptr;
  prometheus::Family<prometheus::Counter>* peer_copy_seconds = nullptr;

  void Build(prometheus::Registry& registry);
};

void DeviceFamilies::Build(prometheus::Registry& registry) {
  kernel_seconds = &prometheus::BuildCounter()
                        .Name("opserve_kernel_seconds_total")
                        .Help("Kernel time of executed nodes, from device events (CPU: wall time).")
                        .Register(registry);
  kernel_bytes =
      &prometheus::BuildCounter()
           .Name("opserve_kernel_bytes_total")
           .Help("Bytes executed nodes had to read and write, at the minimum the op needs.")
           .Register(registry);
  kernel_flops = &prometheus::BuildCounter()
                      .Name("opserve_kernel_flops_total")
                      .Help("Floating-point operations of executed nodes.")
                      .Register(registry);
  kernel_launches = &prometheus::BuildCounter()
                         .Name("opserve_kernel_launches_total")
                         .Help("Executed nodes, one per kernel launch of an op.")
                         .Register(registry);
  queue_duration = &prometheus::BuildHistogram()
                        .Name("opserve_queue_duration_seconds")
                        .Help("Time requests waited for the device's worker.")
                        .Register(registry);
  memory = &prometheus::BuildGauge()
                .Name("opserve_device_memory_bytes")
                .Help(
                    "Device memory: used by stored and in-flight tensors, the server's budget "
                    "for the device, and the device's total.")
                .Register(registry);
  tensors = &prometheus::BuildGauge()
                 .Name("opserve_tensors")
                 .Help("Tensors stored on the device, a shard of a sharded tensor counting as one.")
                 .Register(registry);
  lane_inflight = &prometheus::BuildGauge()
                       .Name("opserve_lane_inflight")
                       .Help(
                           "Requests in flight on a device lane now: 0 to its execution "
                           "contexts (--lane_contexts), those launched behind the one the "
                           "device runs included.")
                       .Register(registry);
  graph_replays = &prometheus::BuildCounter()
                       .Name("opserve_graph_replays_total")
                       .Help(
                           "Execute and ModelInfer requests on a device with a graph cache by "
                           "how their kernels ran: hit (a cached CUDA graph replayed), rebound "
                           "(replayed after an update to the request's tensors), miss (captured "
                           "now), direct (node by node: kernels a graph cannot capture, or "
                           "intermediates over the budget).")
                       .Register(registry);
  serving = &prometheus::BuildGauge()
                 .Name("opserve_device_serving")
                 .Help("1 while the device takes requests, 0 once a fault has marked it out.")
                 .Register(registry);
  queue_depth = &prometheus::BuildGauge()
                     .Name("opserve_device_queue_depth")
                     .Help(
                         "Requests queued or running on the device now: the load that "
                         "placement compares.")
                     .Register(registry);
  peer_copy_bytes = &prometheus::BuildCounter()
                         .Name("opserve_peer_copy_bytes_total")
                         .Help(
                             "Bytes copied from other devices to this one, to bring a graph's "
                             "inputs where it runs or to move and gather tensors.")
                         .Register(registry);
  peer_copy_seconds = &prometheus::BuildCounter()
                           .Name("opserve_peer_copy_seconds_total")
                           .Help("Time of the copies from other devices to this one.")
                           .Register(registry);
}

}  // namespace

struct DeviceMetrics::Impl {
  std::string name;
  const DeviceFamilies* families = nullptr;
  const std::vector<double>* buckets = nullptr;  // Metrics::Impl's: outlives this

  // Children that never change label values.
  prometheus::Gauge* memory_used = nullptr;
  prometheus::Gauge* memory_budget = nullptr;
  prometheus::Gauge* memory_total = nullptr;
  prometheus::Gauge* tensors = nullptr;
  prometheus::Gauge* serving = nullptr;
  prometheus::Gauge* queue_depth = nullptr;
  prometheus::Counter* peer_copy_bytes = nullptr;
  prometheus::Counter* peer_copy_seconds = nullptr;
  std::array<prometheus::Counter*, kGraphResults.size()> graph_results{};
  std::vector<prometheus::Gauge*> lanes;  // written once by InitLanes, before the lanes start

  // Caches of lazily made children. The pointers stay valid: families never drop children.
  std::mutex mu;
  std::unordered_map<KernelKey, KernelSeries, KernelKeyHash, KernelKeyEq> kernels;
  std::unordered_map<std::string, prometheus::Histogram*, StringHash, std::equal_to<>> queues;

  void Build(std::span<const std::string> queued_rpcs);
  KernelSeries& Kernel(std::string_view op, std::string_view algorithm);  // requires mu
  prometheus::Histogram* Queue(std::string_view rpc);                     // requires mu
};

void DeviceMetrics::Impl::Build(std::span<const std::string> queued_rpcs) {
  memory_used = &families->memory->Add({{"device", name}, {"kind", "used"}});
  memory_budget = &families->memory->Add({{"device", name}, {"kind", "budget"}});
  memory_total = &families->memory->Add({{"device", name}, {"kind", "total"}});
  tensors = &families->tensors->Add({{"device", name}});
  serving = &families->serving->Add({{"device", name}});
  serving->Set(1);
  queue_depth = &families->queue_depth->Add({{"device", name}});
  peer_copy_bytes = &families->peer_copy_bytes->Add({{"device", name}});
  peer_copy_seconds = &families->peer_copy_seconds->Add({{"device", name}});
  for (size_t i = 0; i < kGraphResults.size(); ++i) {
    graph_results[i] = &families->graph_replays->Add(
        {{"device", name}, {"result", std::string(kGraphResults[i])}});
  }
  const std::lock_guard<std::mutex> lock(mu);
  // The queue of every RPC that waits for a device, at 0 from the first scrape (as the request
  // series); an RPC that never queues has none.
  for (std::string_view rpc : queued_rpcs) Queue(rpc);
}

KernelSeries& DeviceMetrics::Impl::Kernel(std::string_view op, std::string_view algorithm) {
  if (auto it = kernels.find(KernelKeyView{op, algorithm}); it != kernels.end()) return it->second;
  if (kernels.size() >= kMaxKernelSeries) {
    op = kOverflowLabel;
    algorithm = kOverflowLabel;
    if (auto it = kernels.find(KernelKeyView{op, algorithm}); it != kernels.end()) {
      return it->second;
    }
  }
  const prometheus::Labels labels = {
      {"op", std::string(op)}, {"algorithm", std::string(algorithm)}, {"device", name}};
  KernelSeries series = {&families->kernel_seconds->Add(labels),
                         &families->kernel_bytes->Add(labels), &families->kernel_flops->Add(labels),
                         &families->kernel_launches->Add(labels)};
  return kernels.emplace(KernelKey{std::string(op), std::string(algorithm)}, series).first->second;
}

prometheus::Histogram* DeviceMetrics::Impl::Queue(std::string_view rpc) {
  if (auto it = queues.find(rpc); it != queues.end()) return it->second;
  if (queues.size() >= kMaxRpcs) {
    rpc = kOverflowLabel;
    if (auto it = queues.find(rpc); it != queues.end()) return it->second;
  }
  prometheus::Histogram* queue =
      &families->queue_duration->Add({{"rpc", std::string(rpc)}, {"device", name}}, *buckets);
  queues.emplace(std::string(rpc), queue);
  return queue;
}

DeviceMetrics::DeviceMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceMetrics::~DeviceMetrics() = default;

const std::string& DeviceMetrics::name() const { return impl_->name; }

void DeviceMetrics::InitKernelSeries(std::string_view op, std::string_view algorithm) {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->Kernel(op, algorithm);  // made at 0, or already there
}

void DeviceMetrics::RecordKernel(std::string_view op, std::string_view algorithm, double seconds,
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

void DeviceMetrics::RecordQueue(std::string_view rpc, double seconds) {
  if (!Usable(seconds)) return;
  prometheus::Histogram* queue;
  {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    queue = impl_->Queue(rpc);
  }
  queue->Observe(seconds);
}

void DeviceMetrics::SetMemory(uint64_t used, uint64_t budget, uint64_t total) {
  impl_->memory_used->Set(static_cast<double>(used));
  impl_->memory_budget->Set(static_cast<double>(budget));
  impl_->memory_total->Set(static_cast<double>(total));
}

void DeviceMetrics::SetTensors(int64_t count) { impl_->tensors->Set(static_cast<double>(count)); }

void DeviceMetrics::InitLanes(int lanes) {
  for (int lane = static_cast<int>(impl_->lanes.size()); lane < lanes; ++lane) {
    impl_->lanes.push_back(&impl_->families->lane_inflight->Add(
        {{"device", impl_->name}, {"lane", std::to_string(lane)}}));
  }
}

void DeviceMetrics::SetLaneInflight(int lane, int running) {
  if (lane >= 0 && lane < static_cast<int>(impl_->lanes.size())) {
    impl_->lanes[lane]->Set(running);
  }
}

void DeviceMetrics::RecordGraph(std::string_view result) {
  for (size_t i = 0; i < kGraphResults.size(); ++i) {
    if (kGraphResults[i] == result) impl_->graph_results[i]->Increment();
  }
}

void DeviceMetrics::SetServing(bool serving) { impl_->serving->Set(serving ? 1 : 0); }

void DeviceMetrics::RecordPeerCopy(uint64_t bytes, double seconds) {
  impl_->peer_copy_bytes->Increment(static_cast<double>(bytes));
  if (Usable(seconds)) impl_->peer_copy_seconds->Increment(seconds);
}

void DeviceMetrics::SetQueueDepth(int depth) { impl_->queue_depth->Set(depth); }

struct Metrics::Impl {
  std::vector<double> buckets = LatencyBuckets();
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

  // Families: owned by the registry, built once in Build().
  DeviceFamilies device_families;
  prometheus::Family<prometheus::Counter>* requests = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration = nullptr;
  prometheus::Family<prometheus::Counter>* transfer_bytes = nullptr;

  // Children that never change label values.
  prometheus::Gauge* receive_in_use = nullptr;
  prometheus::Gauge* receive_idle = nullptr;
  prometheus::Gauge* inflight = nullptr;
  prometheus::Gauge* stream_peak = nullptr;
  prometheus::Counter* stream_window_full = nullptr;
  std::atomic<int64_t> stream_peak_value{0};

  // Caches of lazily made children. The pointers stay valid: families never drop children.
  std::mutex mu;
  std::unordered_map<std::string, RpcSeries, StringHash, std::equal_to<>> rpcs;
  std::unordered_map<std::string, prometheus::Counter*, StringHash, std::equal_to<>> directions;

  // After the registry: a device's pointers into the families go before the families do.
  std::vector<std::unique_ptr<DeviceMetrics>> devices;

  // Declared last so that it is destroyed first: no scrape can run into a half-destroyed Impl.
  std::unique_ptr<prometheus::Exposer> exposer;

  void Build(const std::string& backend, std::span<const std::string> rpcs);
  // The entry's key is the label actually used ("other" once the bound is reached).
  std::pair<const std::string, RpcSeries>& Rpc(std::string_view rpc);  // requires mu
  prometheus::Counter* Requests(std::pair<const std::string, RpcSeries>& entry,
                                absl::StatusCode code);        // requires mu
  prometheus::Counter* Direction(std::string_view direction);  // requires mu
};

void Metrics::Impl::Build(const std::string& backend, std::span<const std::string> rpcs) {
  device_families.Build(*registry);
  requests = &prometheus::BuildCounter()
                  .Name("opserve_requests_total")
                  .Help("Finished RPCs by method and gRPC status code.")
                  .Register(*registry);
  request_duration = &prometheus::BuildHistogram()
                          .Name("opserve_request_duration_seconds")
                          .Help("RPC time from the handler's receipt to the response.")
                          .Register(*registry);
  transfer_bytes = &prometheus::BuildCounter()
                        .Name("opserve_transfer_bytes_total")
                        .Help("Tensor bytes moved between clients and the server.")
                        .Register(*registry);
  auto& receive = prometheus::BuildGauge()
                      .Name("opserve_receive_buffer_bytes")
                      .Help(
                          "Host blocks the tensor bytes of a request are received into when they "
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
  stream_peak = &prometheus::BuildGauge()
                     .Name("opserve_stream_unanswered_peak")
                     .Help("The most requests one ExecuteStream or ModelStreamInfer stream has "
                           "had read and not yet answered at once, since start-up: at most "
                           "--stream_window.")
                     .Register(*registry)
                     .Add({});
  stream_window_full = &prometheus::BuildCounter()
                            .Name("opserve_stream_window_full_total")
                            .Help("Times a stream stopped reading because --stream_window of its "
                                  "requests were unanswered (backpressure).")
                            .Register(*registry)
                            .Add({});
  prometheus::BuildGauge()
      .Name("opserve_build_info")
      .Help("Always 1; the labels tell the version and the backend.")
      .Register(*registry)
      .Add({{"version", OPSERVE_VERSION}, {"backend", backend}})
      .Set(1);

  const std::lock_guard<std::mutex> lock(mu);
  // Every code of every RPC the edge names: a series first seen at 1 hides its first increase
  // from rate(), so a lone INTERNAL would never reach the error ratio. The server names its two
  // services' 30 RPCs: 30 x 17 series, no more.
  for (std::string_view rpc : rpcs) {
    auto& entry = Rpc(rpc);
    for (int code = 0; code < kNumCodes; ++code) {
      Requests(entry, static_cast<absl::StatusCode>(code));
    }
  }
  for (std::string_view direction : kDirections) Direction(direction);
}

std::pair<const std::string, RpcSeries>& Metrics::Impl::Rpc(std::string_view rpc) {
  if (auto it = rpcs.find(rpc); it != rpcs.end()) return *it;
  if (rpcs.size() >= kMaxRpcs) {
    rpc = kOverflowLabel;
    if (auto it = rpcs.find(rpc); it != rpcs.end()) return *it;
  }
  RpcSeries series;
  series.duration = &request_duration->Add({{"rpc", std::string(rpc)}}, buckets);
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
                                                         std::span<const std::string> devices,
                                                         const std::string& backend,
                                                         std::span<const std::string> rpcs,
                                                         std::span<const std::string> queued_rpcs) {
  // Two devices of one name would share their series (Family::Add returns the existing child),
  // and an empty label value is the same as no label in PromQL, which would break joins on
  // device.
  if (devices.empty()) return absl::InvalidArgumentError("metrics: no devices to label");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].empty()) {
      return absl::InvalidArgumentError("metrics: device " + std::to_string(i) +
                                        " has an empty name");
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return absl::InvalidArgumentError("metrics: device '" + devices[i] + "' is named twice (" +
                                          std::to_string(j) + " and " + std::to_string(i) + ")");
      }
    }
  }
  auto impl = std::make_unique<Impl>();
  try {
    impl->Build(backend.empty() ? "unknown" : backend, rpcs);
    for (const std::string& name : devices) {
      auto device = std::make_unique<DeviceMetrics::Impl>();
      device->name = name;
      device->families = &impl->device_families;
      device->buckets = &impl->buckets;
      device->Build(queued_rpcs);
      impl->devices.push_back(std::unique_ptr<DeviceMetrics>(new DeviceMetrics(std::move(device))));
    }
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

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& bind_address,
                                                         const std::string& device,
                                                         const std::string& backend,
                                                         std::span<const std::string> rpcs,
                                                         std::span<const std::string> queued_rpcs) {
  const std::string name = device.empty() ? "unknown" : device;
  return Create(bind_address, std::span<const std::string>(&name, 1), backend, rpcs, queued_rpcs);
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Metrics::~Metrics() = default;

DeviceMetrics& Metrics::device(int index) { return *impl_->devices.at(index); }

int Metrics::device_count() const { return static_cast<int>(impl_->devices.size()); }

DeviceMetrics* Metrics::FindDevice(std::string_view name) {
  for (const auto& device : impl_->devices) {
    if (device->name() == name) return device.get();
  }
  return nullptr;
}

void Metrics::InitKernelSeries(std::string_view op, std::string_view algorithm) {
  device(0).InitKernelSeries(op, algorithm);
}

void Metrics::RecordKernel(std::string_view op, std::string_view algorithm, double seconds,
                           uint64_t bytes, uint64_t flops) {
  device(0).RecordKernel(op, algorithm, seconds, bytes, flops);
}

void Metrics::RecordQueue(std::string_view rpc, double seconds) {
  device(0).RecordQueue(rpc, seconds);
}

void Metrics::SetMemory(uint64_t used, uint64_t budget, uint64_t total) {
  device(0).SetMemory(used, budget, total);
}

void Metrics::SetTensors(int64_t count) { device(0).SetTensors(count); }

void Metrics::InitLanes(int lanes) { device(0).InitLanes(lanes); }

void Metrics::SetLaneInflight(int lane, int running) { device(0).SetLaneInflight(lane, running); }

void Metrics::RecordGraph(std::string_view result) { device(0).RecordGraph(result); }

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

void Metrics::RecordTransfer(std::string_view direction, uint64_t bytes) {
  prometheus::Counter* counter;
  {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    counter = impl_->Direction(direction);
  }
  counter->Increment(static_cast<double>(bytes));
}

void Metrics::SetReceiveBuffers(uint64_t in_use_bytes, uint64_t idle_bytes) {
  impl_->receive_in_use->Set(static_cast<double>(in_use_bytes));
  impl_->receive_idle->Set(static_cast<double>(idle_bytes));
}

void Metrics::AddInflight(int64_t delta) {
  if (delta >= 0) {
    impl_->inflight->Increment(static_cast<double>(delta));
  } else {
    impl_->inflight->Decrement(-static_cast<double>(delta));
  }
}

void Metrics::RecordStreamUnanswered(int64_t unanswered) {
  int64_t peak = impl_->stream_peak_value.load(std::memory_order_relaxed);
  while (unanswered > peak && !impl_->stream_peak_value.compare_exchange_weak(peak, unanswered)) {
  }
  if (unanswered > peak) impl_->stream_peak->Set(static_cast<double>(unanswered));
}

void Metrics::RecordStreamWindowFull() { impl_->stream_window_full->Increment(); }

std::string Metrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace opserve
