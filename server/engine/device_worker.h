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

class DeviceWorker {
 public:
  // Requests a lane may have queued on its stream at once by default. A context is held from
  // its launch until a completion thread has finished it (launch, device, outputs: 17.7 us for a
  // small request on the lent H200), so with two a lane launched a burst at one request per
  // 9.9 us where the device took one per 6.6 us; four measured better at 64 clients and no worse
  // at 16 (PERFORMANCE.md, issue 14).
  static constexpr int kDefaultContextsPerLane = 4;
  static constexpr int kMaxContextsPerLane = 8;
  // Completion threads per lane by default; see Start.
  static constexpr int kDefaultCompletionThreads = 2;

  // What runs once a job's queue slot is free: the reply to the client. Replying earlier would
  // let the client's next request arrive while this one still counts against --max_inflight.
  using Completion = std::function<void()>;
  // The second half of a job, on the lane's completion thread with the same context: waits for
  // the device work the first half queued, then finishes (timings, outputs, the commit).
  using Finisher = std::function<Completion(ExecEnv&)>;
  // A job in two halves: queues device work on the context and returns its finisher.
  using AsyncJob = std::function<Finisher(ExecEnv&)>;
  // A job in one piece (warm-up, tests): runs on the launch thread, waits for its own work.
  using Job = std::function<Completion(ExecEnv&)>;

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

  // Queues a job. RESOURCE_EXHAUSTED when `max_queue` jobs are already waiting or in flight;
  // UNAVAILABLE after Shutdown began.
  absl::Status SubmitAsync(AsyncJob job);
  absl::Status Submit(Job job);
  // Runs every job already queued, then stops the threads.
  void Shutdown();
  int depth() const;
  int lanes() const { return static_cast<int>(lanes_.size()); }

 private:
  struct Lane;
  DeviceWorker(Backend& backend, int max_queue, std::chrono::microseconds poll,
               LaneObserver observer);
  bool TakeJob(AsyncJob* job);
  void LaunchLoop(Lane& lane, int completion_threads, int contexts,
                  std::promise<absl::Status>* started);
  void CompletionLoop(Lane& lane);

  Backend& backend_;
  const int max_queue_;
  const std::chrono::microseconds poll_;
  const LaneObserver observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<AsyncJob> jobs_;
  std::atomic<int> queued_{0};  // jobs_.size(), readable without mu_
  int running_ = 0;  // jobs taken and not yet finished, on all lanes
  // Written under mu_ (so Submit and the wait see it in order with the queue); atomic so that the
  // poll loop, which holds no lock, ends at once when Shutdown begins.
  std::atomic<bool> stopping_{false};
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace opserve
