// One thread per device: it owns the device's execution context (stream, cuBLAS handle) and runs
// jobs in order. gRPC threads hand work over here and never wait on the device themselves.
// The queue is bounded: a full queue answers RESOURCE_EXHAUSTED instead of growing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/backend.h"

namespace opserve {

class DeviceWorker {
 public:
  // A job runs on the device and returns what must happen once its queue slot is free: the
  // reply to the client. Replying from inside the job would let the client's next request
  // arrive while this one still counts against --max_inflight.
  using Completion = std::function<void()>;
  using Job = std::function<Completion(ExecEnv&)>;

  // Starts the thread and makes its ExecEnv there; fails if the backend cannot. After each job
  // the thread polls the queue for `poll` before it sleeps on the condition variable: a request
  // that arrives within that window starts without a futex wake-up, at the cost of one core
  // yielding in a loop while requests keep coming.
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Start(
      Backend& backend, int max_queue,
      std::chrono::microseconds poll = std::chrono::microseconds(2000));
  ~DeviceWorker();

  // Queues a job. RESOURCE_EXHAUSTED when `max_queue` jobs are already waiting or running;
  // UNAVAILABLE after Shutdown began.
  absl::Status Submit(Job job);
  // Runs every job already queued, then stops the thread.
  void Shutdown();
  int depth() const;

 private:
  DeviceWorker(Backend& backend, int max_queue, std::chrono::microseconds poll)
      : backend_(backend), max_queue_(max_queue), poll_(poll) {}
  void Loop(std::promise<absl::Status>* started);

  Backend& backend_;
  const int max_queue_;
  const std::chrono::microseconds poll_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::atomic<int> queued_{0};  // jobs_.size(), readable without mu_
  int running_ = 0;
  // Written under mu_ (so Submit and the wait see it in order with the queue); atomic so that the
  // poll loop, which holds no lock, ends at once when Shutdown begins.
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace opserve
