#include "server/engine/device_worker.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace opserve {

absl::StatusOr<std::unique_ptr<DeviceWorker>> DeviceWorker::Start(Backend& backend, int lanes,
                                                                  int max_queue,
                                                                  std::chrono::microseconds poll,
                                                                  LaneObserver observer) {
  if (lanes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lanes must be at least 1, got ", lanes));
  }
  std::unique_ptr<DeviceWorker> w(new DeviceWorker(backend, max_queue, poll, std::move(observer)));
  std::vector<std::promise<absl::Status>> started(lanes);
  for (int lane = 0; lane < lanes; ++lane) {
    w->threads_.emplace_back(&DeviceWorker::Loop, w.get(), lane, &started[lane]);
  }
  absl::Status status;
  for (auto& s : started) status.Update(s.get_future().get());
  if (!status.ok()) {
    w->Shutdown();  // the lanes that did start stop; the failed ones returned
    return status;
  }
  return w;
}

DeviceWorker::~DeviceWorker() { Shutdown(); }

absl::Status DeviceWorker::Submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    const int depth = static_cast<int>(jobs_.size()) + running_;
    if (depth >= max_queue_) {
      return absl::ResourceExhaustedError(absl::StrCat("the device queue is full: ", depth,
                                                       " requests in flight (--max_inflight=",
                                                       max_queue_, ")"));
    }
    jobs_.push_back(std::move(job));
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
  return absl::OkStatus();
}

int DeviceWorker::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(jobs_.size()) + running_;
}

void DeviceWorker::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void DeviceWorker::Loop(int lane, std::promise<absl::Status>* started) {
  auto env = backend_.NewExecEnv();
  started->set_value(env.status());
  if (!env.ok()) return;
  for (;;) {
    Job job;
    // Poll a little before sleeping: a request that arrives within poll_ of the last one
    // starts without a futex wake-up (tens of microseconds on a VM; PERFORMANCE.md).
    const auto spin_until = std::chrono::steady_clock::now() + poll_;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           !stopping_.load(std::memory_order_relaxed) &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and everything queued has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
      ++running_;
    }
    if (observer_) observer_(lane, 1);
    Completion done = job(**env);
    job = nullptr;  // what the job held (a plan, its tensors) goes before the reply
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    if (observer_) observer_(lane, 0);
    if (done) done();
  }
}

}  // namespace opserve
