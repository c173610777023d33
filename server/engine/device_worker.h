// A device's lanes: one thread per lane, each owning an execution context of its own (on CUDA a
// stream, a cuBLAS handle, scratch and staging), all taking jobs from one queue in arrival order.
// With several lanes the host work of one request (inputs, outputs, the reply) overlaps the
// kernels of others, and kernels of different requests may overlap on the device. gRPC threads
// hand work over here and never wait on the device themselves. The queue is bounded: a full
// queue answers RESOURCE_EXHAUSTED instead of growing.
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
#include <vector>

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

  // Called with (lane, jobs running on it: 0 or 1) whenever a lane starts or ends a job; for the
  // metrics. Runs on the lane's thread.
  using LaneObserver = std::function<void(int lane, int running)>;

  // Starts `lanes` threads, each making its ExecEnv on itself; fails if the backend cannot.
  // After each job a thread polls the queue for `poll` before it sleeps on the condition
  // variable: a request that arrives within that window starts without a futex wake-up, at the
  // cost of a core yielding in a loop while requests keep coming. `max_queue` bounds the jobs
  // waiting and running on all lanes together.
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Start(
      Backend& backend, int lanes, int max_queue,
      std::chrono::microseconds poll = std::chrono::microseconds(2000),
      LaneObserver observer = nullptr);
  ~DeviceWorker();

  // Queues a job. RESOURCE_EXHAUSTED when `max_queue` jobs are already waiting or running;
  // UNAVAILABLE after Shutdown began.
  absl::Status Submit(Job job);
  // Runs every job already queued, then stops the threads.
  void Shutdown();
  int depth() const;
  int lanes() const { return static_cast<int>(threads_.size()); }

 private:
  DeviceWorker(Backend& backend, int max_queue, std::chrono::microseconds poll,
               LaneObserver observer)
      : backend_(backend), max_queue_(max_queue), poll_(poll), observer_(std::move(observer)) {}
  void Loop(int lane, std::promise<absl::Status>* started);

  Backend& backend_;
  const int max_queue_;
  const std::chrono::microseconds poll_;
  const LaneObserver observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::atomic<int> queued_{0};  // jobs_.size(), readable without mu_
  int running_ = 0;  // on all lanes
  // Written under mu_ (so Submit and the wait see it in order with the queue); atomic so that the
  // poll loop, which holds no lock, ends at once when Shutdown begins.
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;  // one per lane
};

}  // namespace opserve
