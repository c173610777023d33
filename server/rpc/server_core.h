// What the two services at the edge share: opserve.v1.OpServe (service.h) and the Open
// Inference Protocol (inference_service.h) run on one ServerCore, which holds the engine (the
// device, the store, the metrics, the limits, the batcher) and what the edge itself keeps: the
// tokens, the saved graphs, the shared-memory regions, the receive pool, the transfer threads
// and the count of calls in flight.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/engine.h"
#include "server/engine/request_trace.h"
#include "server/rpc/graph_store.h"
#include "server/rpc/receive_pool.h"
#include "server/rpc/shared_memory.h"
#include "server/rpc/transfer_pool.h"

namespace opserve {

struct ServiceOptions {
  Limits limits;
  uint32_t default_chunk_bytes = 1 << 20;
  // Bearer token -> tenant (the tensor namespace). Empty: no authentication, one namespace.
  std::map<std::string, std::string> tokens;
#if OPSERVE_TEST_HOOKS
  // Test builds: "op/algorithm" whose every run fails as a faulty kernel would.
  std::string fail_algorithm;
  // Test builds: answer Execute and ModelInfer without running the graph (EngineOptions says
  // how): "handler", "launch" or "lane".
  std::string reply_without_device;
  // Test builds: "NAME[@K]", the device whose K-th request injects a sticky fault.
  std::string fail_device;
#endif
  // Where graph calls record their timelines (--trace_requests); nullptr: nowhere.
  RequestTrace* trace = nullptr;
  // Most graph calls that run as one plan (--max_batch_size; server/engine/batch.h); 1: none.
  int max_batch_size = 1;
  // Most unanswered requests of one graph stream (--stream_window; graph_stream.h).
  int stream_window = 16;
};

// The names of the RPCs whose request series exist from start-up, every code at 0, so that
// rate() and the alert rules see a 0 rather than no series before the first request (or the
// first error): every method of opserve.v1.OpServe and of the Open Inference Protocol, as their
// generated descriptors list them.
std::vector<std::string> MetricRpcNames();
// The RPCs that wait for a device's worker (their calls are GraphCalls: Execute, ModelInfer),
// whose queue-time series exist from start-up; no other RPC has one.
std::vector<std::string> QueuedRpcNames();

// OK while the call is alive; DEADLINE_EXCEEDED once its deadline passed, CANCELLED once the
// client cancelled it. Checked before work starts, between nodes, and at each commit.
absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx);

class ServerCore {
 public:
  // `devices` and `collectives` as Engine takes them.
  ServerCore(std::span<Device* const> devices, TensorStore& store, Metrics* metrics,
             Collectives* collectives, ServiceOptions options);

  Engine& engine() { return engine_; }
  Device& device() { return engine_.device(); }
  Backend& backend() { return engine_.backend(); }
  TensorStore& store() { return engine_.store(); }
  Metrics* metrics() { return engine_.metrics(); }
  const ServiceOptions& options() const { return options_; }
  GraphStore& graphs() { return graphs_; }
  // Registered through the Open Inference Protocol; PutTensor, GetTensor, Execute and
  // ModelInfer name them.
  SharedMemoryRegistry& regions() { return regions_; }
  TransferPool& transfers() { return transfers_; }
  // Where Execute and ModelInfer receive their large tensor bytes (receive_pool.h).
  const std::shared_ptr<ReceivePool>& receive_pool() { return receive_pool_; }

  // Called when every device failed for good (a sticky device error).
  // Set once, before the server starts; may be called again and again.
  void set_on_unhealthy(std::function<void()> f) { engine_.set_on_unhealthy(std::move(f)); }
  void UpdateStoreGauges() { engine_.UpdateStoreGauges(); }
  void RecordRpc(absl::string_view rpc, const absl::Status& s,
                 std::chrono::steady_clock::time_point start);

  // A graph stream's unanswered requests, and its window filling (graph_stream.h).
  void RecordStreamUnanswered(int unanswered) {
    if (metrics() != nullptr) metrics()->RecordStreamUnanswered(unanswered);
  }
  void RecordStreamWindowFull() {
    if (metrics() != nullptr) metrics()->RecordStreamWindowFull();
  }

  // Calls handed to a handler and not yet done (OnDone), for the drain on SIGTERM.
  void CallStarted() { active_calls_.fetch_add(1, std::memory_order_relaxed); }
  void CallDone() { active_calls_.fetch_sub(1, std::memory_order_relaxed); }
  int active_calls() const { return active_calls_.load(std::memory_order_relaxed); }

  // The caller's tenant from its bearer token; UNAUTHENTICATED when tokens are
  // configured and the call has none or a wrong one.
  absl::StatusOr<std::string> Authenticate(grpc::CallbackServerContext* ctx) const;
  // The caller's tenant, once a call that runs a graph may start: authenticated, a device
  // serving (UNAVAILABLE otherwise), and the call not already dead (its deadline passed in
  // transit).
  absl::StatusOr<std::string> Admit(grpc::CallbackServerContext* ctx);
  // The answer to a request of `rpc` that did not parse (`parse`), counted like any other: a
  // caller without a valid token learns nothing more than UNAUTHENTICATED.
  absl::Status RefuseUnparsed(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                              const absl::Status& parse);

 private:
  // Idle receive blocks kept for the next request: two of the largest message, so that a
  // client sending one after another never maps memory again; at least 64 MiB.
  static uint64_t ReceiveCacheBytes(const Limits& limits) {
    return std::max<uint64_t>(64 << 20, 2 * limits.max_message_bytes);
  }

  const ServiceOptions options_;
  Engine engine_;
  GraphStore graphs_;
  SharedMemoryRegistry regions_;
  std::atomic<int> active_calls_{0};
  const std::shared_ptr<ReceivePool> receive_pool_;
  // Steps of PutTensor / GetTensor that may wait on the device. Destroyed with the core, after
  // the gRPC server has finished every call: in gRPC 1.51, Server::Shutdown returns only once
  // every callback call's OnDone has run (each call holds a server reference until then), so no
  // reactor and no posted step outlives it.
  static constexpr int kTransferThreads = 4;
  TransferPool transfers_{kTransferThreads};
};

}  // namespace opserve
