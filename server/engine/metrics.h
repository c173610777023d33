// Prometheus metrics, exported on --metrics_port at /metrics through prometheus-cpp.
// Families are built once at start-up with a fixed, small label set (op, algorithm, device, rpc,
// code, direction, kind): never shapes, names or request ids.
//
// One process serves several devices ("cuda:0", "cuda:1", or "cpu:0", "cpu:1"): every
// device-level series carries device=<name>, and each device's are reached through its
// DeviceMetrics. Requests, transfers, receive buffers and in-flight RPCs are the process's and
// carry no device label.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace opserve {

// The series of one device. Owned by its Metrics and valid as long as it is; thread-safe.
class DeviceMetrics {
 public:
  DeviceMetrics(const DeviceMetrics&) = delete;
  DeviceMetrics& operator=(const DeviceMetrics&) = delete;
  ~DeviceMetrics();

  // The device label of this device's series ("cuda:1").
  const std::string& name() const;

  // Makes the kernel series of (op, algorithm) on this device exist at 0 in every kernel family.
  // The server declares each row its backend runs at start-up, so that dashboards and rate()
  // have a series from the first scrape instead of from the first launch (a series first seen at
  // 1 hides that increase from rate()).
  void InitKernelSeries(std::string_view op, std::string_view algorithm);
  // One kernel launch of a node on this device: its time, minimal bytes and FLOPs.
  void RecordKernel(std::string_view op, std::string_view algorithm, double seconds, uint64_t bytes,
                    uint64_t flops);
  // Time a request waited for this device's worker.
  void RecordQueue(std::string_view rpc, double seconds);
  void SetMemory(uint64_t used, uint64_t budget, uint64_t total);
  // Tensors (and shards of sharded tensors) stored on this device.
  void SetTensors(int64_t count);
  // Makes the lane series exist at 0 for lanes 0 .. lanes - 1 (call once, before
  // SetLaneInflight).
  void InitLanes(int lanes);
  // Jobs in flight on `lane` now (0 to its contexts, --lane_contexts).
  void SetLaneInflight(int lane, int running);
  // How a request ran where the device keeps CUDA graphs: "hit", "rebound", "miss" or "direct"
  // (opserve_graph_replays_total).
  void RecordGraph(std::string_view result);
  // 1 while the device takes requests, 0 once it is marked out (every device starts at 1).
  void SetServing(bool serving);
  // One copy of `bytes` from another device to this one (the destination), taking `seconds`.
  void RecordPeerCopy(uint64_t bytes, double seconds);
  // Requests queued or running on this device now: the load placement compares.
  void SetQueueDepth(int depth);

 private:
  friend class Metrics;
  struct Impl;
  explicit DeviceMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Metrics {
 public:
  // Starts the exposer on `bind_address` (e.g. "0.0.0.0:9464"). An empty address builds the
  // families but serves nothing (tests, tools). `devices` names the devices the process serves,
  // in the order device(index) takes; each has its memory, tensor, serving, queue, lane,
  // graph-replay and peer-copy series from the start. Every code of each of `rpcs` (the edge's
  // RPC names) has its request series from the start, and each of `queued_rpcs` (those that
  // wait for a device's worker) its queue-time series on every device. INVALID_ARGUMENT when `devices` is empty,
  // or names a device twice or with an empty name.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& bind_address,
                                                         std::span<const std::string> devices,
                                                         const std::string& backend,
                                                         std::span<const std::string> rpcs,
                                                         std::span<const std::string> queued_rpcs);
  // The one-device form: `device` labels the device-scoped series (an empty name is "unknown").
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& bind_address,
                                                         const std::string& device,
                                                         const std::string& backend,
                                                         std::span<const std::string> rpcs,
                                                         std::span<const std::string> queued_rpcs);
  ~Metrics();

  // The devices given to Create, in their order. 0 <= index < device_count(): the server's own
  // device indices, never request data (out of range throws std::out_of_range).
  DeviceMetrics& device(int index);
  int device_count() const;
  // The device labelled `name`, or nullptr.
  DeviceMetrics* FindDevice(std::string_view name);

  // The one-device form: each acts on device(0) (see DeviceMetrics).
  void InitKernelSeries(std::string_view op, std::string_view algorithm);
  void RecordKernel(std::string_view op, std::string_view algorithm, double seconds, uint64_t bytes,
                    uint64_t flops);
  void RecordQueue(std::string_view rpc, double seconds);
  void SetMemory(uint64_t used, uint64_t budget, uint64_t total);
  void SetTensors(int64_t count);
  void InitLanes(int lanes);
  void SetLaneInflight(int lane, int running);
  void RecordGraph(std::string_view result);

  // The process's series, with no device label.
  // One finished RPC with its final status code, e.g. ("Execute", absl::StatusCode::kOk, 0.01).
  void RecordRequest(std::string_view rpc, absl::StatusCode code, double seconds);
  // Bytes moved between clients and the server: direction is "upload" or "download".
  void RecordTransfer(std::string_view direction, uint64_t bytes);
  // Host blocks large request fields are received into (server/rpc/receive_pool.h): held by
  // requests, and idle, kept for the next.
  void SetReceiveBuffers(uint64_t in_use_bytes, uint64_t idle_bytes);
  void AddInflight(int64_t delta);
  // A graph stream (server/rpc/graph_stream.h) has `unanswered` requests read and not yet
  // answered: the peak over every stream is exported.
  void RecordStreamUnanswered(int64_t unanswered);
  // A graph stream stopped reading with its window full.
  void RecordStreamWindowFull();

  // The text exposition of everything registered (for tests and the CLI).
  std::string Scrape() const;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace opserve
