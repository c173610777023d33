// One device as the engine uses it: its backend (memory through a budget, copies) and its
// worker, whose lanes (a stream and cuBLAS handle, a launch thread and completion threads, and
// execution contexts with their scratch and staging) take jobs from one queue. More devices
// are more of these objects; nothing above the engine holds a worker directly.
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/engine/device_worker.h"

namespace opserve {

class Device {
 public:
  // Starts the worker (see DeviceWorker::Start for `lanes`, `max_queue`, `poll`, `observer`,
  // `completion_threads`, `contexts`).
  static absl::StatusOr<std::unique_ptr<Device>> Start(
      std::unique_ptr<Backend> backend, int lanes, int max_queue,
      std::chrono::microseconds poll = std::chrono::microseconds(2000),
      DeviceWorker::LaneObserver observer = nullptr,
      int completion_threads = DeviceWorker::kDefaultCompletionThreads,
      int contexts = DeviceWorker::kDefaultContextsPerLane);

  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  // Queues a job on the worker: RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once
  // Shutdown began.
  // The job stays the caller's and must live until its Reply (device_worker.h).
  absl::Status Submit(DeviceJob* job) { return worker_->Submit(job); }
  absl::Status Submit(DeviceWorker::Job job) { return worker_->Submit(std::move(job)); }
  int queue_depth() const { return worker_->depth(); }
  int lanes() const { return worker_->lanes(); }
  // Runs the jobs already queued, then stops the worker. The backend lives on.
  void Shutdown() { worker_->Shutdown(); }

 private:
  Device(std::unique_ptr<Backend> backend, std::unique_ptr<DeviceWorker> worker)
      : backend_(std::move(backend)), worker_(std::move(worker)) {}

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceWorker> worker_;  // after backend_: stopped before it goes
};

}  // namespace opserve
