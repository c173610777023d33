// A device's lanes. Each lane is a stream (on CUDA, with its cuBLAS handle) and its threads: a
// launch thread that takes jobs from the device's one queue and queues their device work, and
// completion threads that each take the next job launched, wait for its work to end, finish it
// and hand its reply over (to gRPC, which sends it on that thread). With two, one replies
// while the other already waits for the next job's work.
// A lane has several execution contexts (timing events, scratch, staging) on its stream, so its
// launch thread queues the next request while a completion thread waits for the last:
// no thread that launches work ever waits for the device at the end of a request. gRPC threads
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

// What a lane runs: a job in three stages, each on the thread named. A request that runs a graph
// is one (request.h), and so is a batch of them (batch.h).
class DeviceJob {
 public:
  // On a lane's launch thread, with one of the lane's contexts: queues the job's device work on
  // `env` without waiting for it. False: the job already ended here and is gone (nothing to
  // complete or reply; its context still comes free through a completion thread).
  virtual bool Launch(ExecEnv& env) = 0;
  // On one of the lane's completion threads, with the same context: waits for the work Launch
  // queued and finishes the job. What the job holds on the device goes here.
  virtual void Complete(ExecEnv& env) = 0;
  // Once the job's queue slot and context are free, on the same completion thread: the job's
  // answer goes out (the reply to the client). Replying earlier would let the client's next
  // request arrive while this one still counts against --max_inflight. The job may be gone
  // once it returns.
  virtual void Reply() = 0;

 protected:
  ~DeviceJob() = default;
};

class DeviceWorker {
 public:
  // Requests a lane may have queued on its stream at once by default. A context is held from
  // its launch until a completion thread has finished it (launch, device, outputs: 17.7 us for a
  // small request on an H200), so with two a lane launched a burst at one request per
  // 9.9 us where the device took one per 6.6 us; four measured better at 64 clients and no worse
  // at 16 (docs/performance/history.md, "The service under concurrent load").
  static constexpr int kDefaultContextsPerLane = 4;
  static constexpr int kMaxContextsPerLane = 8;
  // Completion threads per lane by default; see Start.
  static constexpr int kDefaultCompletionThreads = 2;

  // A job in one piece (warm-up, tests): runs on the launch thread and waits for its own work.
  using Job = std::function<void(ExecEnv&)>;

  // Called with (lane, jobs in flight on it: 0 to the contexts per lane) whenever a lane starts or ends
  // a job; for the metrics. Runs on the lane's threads, in the order of the changes.
  using LaneObserver = std::function<void(int lane, int running)>;

  // Starts `lanes` lanes, each making its contexts on its launch thread; fails if the backend
  // cannot. After each job a launch thread polls the queue (or, with both contexts busy, for
  // one to come free) for `poll` before it sleeps on a condition variable: a request that
  // arrives within that window starts without a futex wake-up, at the cost of a core spinning
  // while requests keep coming. `max_queue` bounds the jobs waiting and in flight on all lanes
  // together. `completion_threads` per lane finish its jobs, in parallel; `contexts` per lane
  // (1 to kMaxContextsPerLane) bound its jobs in flight.
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Start(
      Backend& backend, int lanes, int max_queue,
      std::chrono::microseconds poll = std::chrono::microseconds(2000),
      LaneObserver observer = nullptr, int completion_threads = kDefaultCompletionThreads,
      int contexts = kDefaultContextsPerLane);
  ~DeviceWorker();

  // Queues a job; it stays the caller's, and must live until its Reply. RESOURCE_EXHAUSTED when
  // `max_queue` jobs are already waiting or in flight; UNAVAILABLE after Shutdown began.
  absl::Status Submit(DeviceJob* job);
  // Queues a job in one piece, wrapped in a DeviceJob of its own.
  absl::Status Submit(Job job);
  // Runs every job already queued, then stops the threads.
  void Shutdown();
  int depth() const;
  int lanes() const { return static_cast<int>(lanes_.size()); }

 private:
  struct Lane;
  DeviceWorker(Backend& backend, int max_queue, std::chrono::microseconds poll,
               LaneObserver observer);
  bool TakeJob(DeviceJob** job);
  void LaunchLoop(Lane& lane, int completion_threads, int contexts,
                  std::promise<absl::Status>* started);
  void CompletionLoop(Lane& lane);

  Backend& backend_;
  const int max_queue_;
  const std::chrono::microseconds poll_;
  const LaneObserver observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DeviceJob*> jobs_;
  std::atomic<int> queued_{0};  // jobs_.size(), readable without mu_
  int running_ = 0;  // jobs taken and not yet finished, on all lanes
  // Written under mu_ (so Submit and the wait see it in order with the queue); atomic so that the
  // poll loop, which holds no lock, ends at once when Shutdown begins.
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace opserve
