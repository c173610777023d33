// The engine as the edge sees it: the node's devices (each a backend and worker, with its own
// batcher and health), one tensor store over them, the metrics and the limits, and the one way
// in for a request that runs a graph (Submit). What a request passes through is in request.h;
// where it runs, placement.cc; a request over a sharded tensor, shard.h.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/batch.h"
#include "server/engine/collectives.h"
#include "server/engine/device.h"
#include "server/engine/metrics.h"
#include "server/engine/plan.h"
#include "server/engine/request.h"
#include "server/engine/tensor_store.h"

namespace opserve {

struct EngineOptions {
  Limits limits;
  // Most requests that run as one plan (--max_batch_size; batch.h); 1: none.
  int max_batch_size = 1;
#if OPSERVE_TEST_HOOKS
  // "op/algorithm" whose every run fails as a faulty kernel would.
  std::string fail_algorithm;
  // Answer requests without running their graph, with zeros of the outputs' sizes: "handler" on
  // the submitting thread after planning, "launch" on a lane's launch thread (its slot freed
  // after the reply), "lane" through a lane's launch and completion threads. Graphs that store
  // an output or write one to a shared-memory region run as usual. It tells what the edge and
  // the hand-offs cost from what the device does (opserve-bench --load_variant).
  std::string reply_without_device;
  // "NAME[@K]": the K-th request (1 when no @K) that runs on device NAME injects a sticky
  // device fault there, as a faulty kernel would (--test_fail_device).
  std::string fail_device;
#endif
};

// One device of the node as the engine schedules it: its worker and backend, its batcher, and
// whether it still serves.
struct EngineDevice {
  Device* device = nullptr;
  std::unique_ptr<Batcher> batcher;
  std::string name;  // "cuda:1", "cpu:0": what clients name it by
  // Once set, the device is out for good (a sticky device error): requests placed there, and
  // reads of tensors living there, answer UNAVAILABLE. Under Engine::mu_.
  absl::Status failed;
  // Requests queued or running there now, for least-loaded placement.
  std::atomic<int> load{0};
};

class Engine {
 public:
  // `devices` (at least one) and `store` outlive the engine; `metrics` may be nullptr (none);
  // `collectives` moves bytes between the devices (collectives.h) and may be nullptr with one
  // device.
  Engine(std::span<Device* const> devices, TensorStore& store, Metrics* metrics,
         Collectives* collectives, EngineOptions options);
  ~Engine();

  // Places the request (placement.cc), plans it on the calling thread and queues it on the
  // device, alone or in a batch; a request that reads a sharded tensor runs as one request per
  // shard (shard.h). The request comes back through its client's Done, exactly once: at once
  // when it fails here (an invalid graph, a full queue, a failed device), otherwise from a lane
  // once it ran.
  void Submit(std::unique_ptr<Request> request);

  // Called when every device failed for good (a sticky device error), by a request that saw it
  // or by the edge. Set once, before the server starts.
  void set_on_unhealthy(std::function<void()> f) { on_unhealthy_ = std::move(f); }
  // Device `i` failed for good with `why`: it serves no more; when none is left, the server is
  // unhealthy. Idempotent.
  void MarkFailed(int i, const absl::Status& why);
  // OK while device `i` serves; otherwise UNAVAILABLE naming it and why it failed.
  absl::Status Serving(int i) const;
  // OK while any device serves.
  absl::Status AnyServing() const;
  // The memory and tensor gauges, as they stand.
  void UpdateStoreGauges();

  int num_devices() const { return static_cast<int>(devices_.size()); }
  Device& device(int i = 0) { return *devices_[i]->device; }
  Backend& backend(int i = 0) { return devices_[i]->device->backend(); }
  const Backend& backend(int i = 0) const { return devices_[i]->device->backend(); }
  const std::string& device_name(int i) const { return devices_[i]->name; }
  const std::vector<std::string>& device_names() const { return names_; }
  // The device a client names ("cuda:1"): INVALID_ARGUMENT for one the server does not serve,
  // UNAVAILABLE for one that failed. `what` names the asker in the message.
  absl::StatusOr<int> FindDevice(absl::string_view name, absl::string_view what) const;
  // "cuda:0" or, for a sharded tensor, "cuda:0,cuda:1".
  std::string DeviceOf(const StoredTensor& t) const;
  // OK when every device the tensor lives on serves; UNAVAILABLE naming the tensor and device.
  absl::Status Readable(const StoredTensor& t) const;
  TensorStore& store() { return store_; }
  Metrics* metrics() { return metrics_; }
  // Device `i`'s series; nullptr without metrics.
  DeviceMetrics* device_metrics(int i) { return metrics_ ? &metrics_->device(i) : nullptr; }
  // `bytes` copied onto device `i` from others in `seconds` (the peer-copy counters).
  void RecordPeerCopy(int i, uint64_t bytes, double seconds) {
    if (metrics_ != nullptr && bytes > 0) metrics_->device(i).RecordPeerCopy(bytes, seconds);
  }
  Collectives* collectives() { return collectives_; }
  const EngineOptions& options() const { return options_; }

  // Placement (placement.cc).
  // Where a new tensor goes when the client names no device: the serving device with the most
  // free budget.
  absl::StatusOr<int> PlaceNew() const;
  // The row ranges a sharded put of `meta` (rank 2) splits into: one per serving device, the
  // first rows % N one row more, none empty.
  absl::StatusOr<std::vector<TensorShard>> ShardRows(const TensorMeta& meta, absl::string_view what) const;
  // Copies `t` whole onto device `dst` (a move, or the gather of a sharded tensor), as a new
  // tensor of the same name charged to dst's budget; `bytes` gets the bytes that crossed.
  absl::StatusOr<StoredTensorPtr> CopyTo(const StoredTensor& t, int dst, uint64_t* bytes);
  // CopyTo for a request's input, left running where the devices can copy beside the kernels
  // (Collectives::StartBroadcast): the copy's arrival is set and *running holds the copy, which
  // must finish before the copy's memory goes. Otherwise as CopyTo, *running null.
  absl::StatusOr<StoredTensorPtr> CopyInArriving(const StoredTensor& t, int dst, uint64_t* bytes,
                                                 std::unique_ptr<ArrivingBroadcast>* running);
  // How a tensor of `meta` crosses in blocks a reader can start on (InputArrival): a matrix
  // [K, N] as `rows` rows of `row_bytes`, its first eighth of columns then the rest, so that a
  // GEMM reading it computes whole columns of C from each block; anything else as one row.
  static std::vector<uint64_t> ArrivalBlocks(const TensorMeta& meta, uint64_t* rows,
                                             uint64_t* row_bytes);
  // Memory on device dst for a copy of `t`; the error names the tensor and the device.
  absl::StatusOr<BufferPtr> AllocateCopy(const StoredTensor& t, int dst);
  // Bytes [offset, offset + bytes) of `t` into host memory, across its shards if it has them
  // (GetTensor). A sticky device error takes the device out.
  absl::Status CopyOut(const StoredTensor& t, uint64_t offset, void* dst, uint64_t bytes);

 private:
  friend class Request;
  friend class BatchJob;
  friend class ShardedRun;
  // Queues a planned request on its device (request->device_).
  void Queue(std::unique_ptr<Request> request);
  // Looks each stored input of `graph` up once, binding it (Graph::bound): placement, the
  // sharded-run check and planning all read the same tensors.
  void BindStoredInputs(Graph& graph, const std::string& tenant) const;
  // Picks the device of a request from its bound stored inputs and the devices' load
  // (placement.cc).
  absl::StatusOr<int> PlaceGraph(const Graph& graph) const;
  // Replaces the plan's stored inputs that live elsewhere than device `d` by copies there.
  absl::Status GatherInputs(Request& request, int d);
  int LeastLoaded() const;
  // Requests queued or running on device `i` change by `delta` (placement and the gauge read it).
  void AddLoad(int i, int delta);
#if OPSERVE_TEST_HOOKS
  // Whether the request now starting on device `i` is the one --test_fail_device names.
  bool TakeInjectedFault(int i);
#endif

  std::vector<std::unique_ptr<EngineDevice>> devices_;
  std::vector<std::string> names_;
  TensorStore& store_;
  Metrics* const metrics_;
  Collectives* const collectives_;
  const EngineOptions options_;
  std::function<void()> on_unhealthy_;
  mutable std::mutex mu_;  // EngineDevice::failed
  mutable std::atomic<unsigned> round_robin_{0};
#if OPSERVE_TEST_HOOKS
  std::atomic<int> fault_countdown_{0};
  int fault_device_ = -1;
#endif
};

}  // namespace opserve
