// Prometheus metrics, exported on --metrics_port at /metrics through prometheus-cpp.
// Families are built once at start-up with a fixed, small label set (op, algorithm, device, rpc,
// code, direction, kind): never shapes, names or request ids.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace opserve {

class Metrics {
 public:
  // Starts the exposer on `bind_address` (e.g. "0.0.0.0:9464"). An empty address builds the
  // families but serves nothing (tests, tools). `device` labels device-scoped series. Every
  // code of each of `rpcs` (the edge's RPC names) has its request series from the start.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& bind_address,
                                                         const std::string& device,
                                                         const std::string& backend,
                                                         std::span<const std::string> rpcs);
  ~Metrics();

  // Makes the kernel series of (op, algorithm) exist at 0 in every kernel family. The server
  // declares each row its backend runs at start-up, so that dashboards and rate() have a series
  // from the first scrape instead of from the first launch (a series first seen at 1 hides that
  // increase from rate()).
  void InitKernelSeries(std::string_view op, std::string_view algorithm);
  // One kernel launch of a node: its time, minimal bytes and FLOPs.
  void RecordKernel(std::string_view op, std::string_view algorithm, double seconds,
                    uint64_t bytes, uint64_t flops);
  // One finished RPC with its final status code, e.g. ("Execute", absl::StatusCode::kOk, 0.01).
  void RecordRequest(std::string_view rpc, absl::StatusCode code, double seconds);
  // Time a request waited for the device worker.
  void RecordQueue(std::string_view rpc, double seconds);
  // Bytes moved between clients and the server: direction is "upload" or "download".
  void RecordTransfer(std::string_view direction, uint64_t bytes);
  void SetMemory(uint64_t used, uint64_t budget, uint64_t total);
  void SetTensors(int64_t count);
  // Host blocks large request fields are received into (server/rpc/receive_pool.h): held by
  // requests, and idle, kept for the next.
  void SetReceiveBuffers(uint64_t in_use_bytes, uint64_t idle_bytes);
  void AddInflight(int64_t delta);
  // Makes the lane series exist at 0 for lanes 0 .. lanes - 1 (call once, before
  // SetLaneInflight).
  void InitLanes(int lanes);
  // Jobs in flight on `lane` now (0 to its contexts, --lane_contexts).
  void SetLaneInflight(int lane, int running);
  // How a request ran where the device keeps CUDA graphs: "hit", "rebound", "miss" or "direct"
  // (opserve_graph_replays_total).
  void RecordGraph(std::string_view result);

  // The text exposition of everything registered (for tests and the CLI).
  std::string Scrape() const;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace opserve
