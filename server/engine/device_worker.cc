#include "server/engine/device_worker.h"

#include <pthread.h>

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"

namespace opserve {
namespace {

// Spins until `ready()` or `poll` has passed, whichever is first; the caller then sleeps on its
// condition variable if need be. Each step is a pause instruction rather than sched_yield, which
// is a system call (in a gVisor sandbox, one served by the sandbox's own kernel, whose CPU its
// network stack needs too). Every 64th step still yields, so that a poller on a machine with
// fewer cores than busy threads lets the ones with work run.
template <typename Ready>
void PollFor(std::chrono::microseconds poll, Ready ready) {
  const auto until = std::chrono::steady_clock::now() + poll;
  for (unsigned step = 1; !ready() && std::chrono::steady_clock::now() < until; ++step) {
    if (step % 64 == 0) {
      std::this_thread::yield();
      continue;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#else
    std::this_thread::yield();
#endif
  }
}

// Names a lane's thread as top, ps and /proc show it: a lane's CPU time can then be told apart
// from gRPC's own threads. Linux keeps 15 characters.
void NameThread(std::thread& t, const std::string& name) {
  pthread_setname_np(t.native_handle(), name.substr(0, 15).c_str());
}

}  // namespace

// One lane: its contexts, made and destroyed on its launch thread, and the hand-over between
// its two threads. `mu` orders the slots, the jobs launched and the observer's calls.
struct DeviceWorker::Lane {
  struct Pending {
    DeviceJob* job;  // nullptr: the job ended at its launch; only its context comes free
    ExecEnv* env;
  };

  explicit Lane(int i) : index(i) {}
  const int index;
  std::mutex mu;
  std::condition_variable slot_freed;  // the launch thread waits for a free context
  std::condition_variable launched;    // the completion thread waits for a job launched
  std::vector<ExecEnv*> free_slots;
  std::atomic<int> free_count{0};  // free_slots.size(), readable without mu
  std::deque<Pending> pending;
  std::atomic<int> pending_count{0};  // pending.size(), readable without mu
  int in_flight = 0;
  bool launch_done = false;  // the launch thread queues nothing more
  std::thread launch_thread;
  std::vector<std::thread> completion_threads;
};

absl::StatusOr<std::unique_ptr<DeviceWorker>> DeviceWorker::Start(Backend& backend, int lanes,
                                                                  int max_queue,
                                                                  std::chrono::microseconds poll,
                                                                  LaneObserver observer,
                                                                  int completion_threads,
                                                                  int contexts) {
  if (lanes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lanes must be at least 1, got ", lanes));
  }
  if (completion_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion threads must be at least 1, got ", completion_threads));
  }
  if (contexts < 1 || contexts > kMaxContextsPerLane) {
    return absl::InvalidArgumentError(absl::StrCat("contexts per lane must be 1 to ",
                                                   kMaxContextsPerLane, ", got ", contexts));
  }
  std::unique_ptr<DeviceWorker> w(new DeviceWorker(backend, max_queue, poll, std::move(observer)));
  std::vector<std::promise<absl::Status>> started(lanes);
  for (int i = 0; i < lanes; ++i) w->lanes_.push_back(std::make_unique<Lane>(i));
  for (int i = 0; i < lanes; ++i) {
    w->lanes_[i]->launch_thread =
        std::thread(&DeviceWorker::LaunchLoop, w.get(), std::ref(*w->lanes_[i]),
                    completion_threads, contexts, &started[i]);
    NameThread(w->lanes_[i]->launch_thread, absl::StrCat("lane", i, "-launch"));
  }
  absl::Status status;
  for (auto& s : started) status.Update(s.get_future().get());
  if (!status.ok()) {
    w->Shutdown();  // the lanes that did start stop; the failed ones returned
    return status;
  }
  return w;
}

DeviceWorker::DeviceWorker(Backend& backend, int max_queue, std::chrono::microseconds poll,
                           LaneObserver observer)
    : backend_(backend), max_queue_(max_queue), poll_(poll), observer_(std::move(observer)) {}

DeviceWorker::~DeviceWorker() { Shutdown(); }

absl::Status DeviceWorker::Submit(DeviceJob* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    const int depth = static_cast<int>(jobs_.size()) + running_;
    if (depth >= max_queue_) {
      return absl::ResourceExhaustedError(absl::StrCat("the device queue is full: ", depth,
                                                       " requests in flight (--max_inflight=",
                                                       max_queue_, ")"));
    }
    jobs_.push_back(job);
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
  return absl::OkStatus();
}

namespace {

// A job in one piece: it runs at its launch, and is gone once its context is free.
class OnePieceJob final : public DeviceJob {
 public:
  explicit OnePieceJob(DeviceWorker::Job run) : run_(std::move(run)) {}
  bool Launch(ExecEnv& env) override {
    run_(env);
    return true;
  }
  void Complete(ExecEnv&) override {}
  void Reply() override { delete this; }

 private:
  ~OnePieceJob() = default;
  DeviceWorker::Job run_;
};

}  // namespace

absl::Status DeviceWorker::Submit(Job job) {
  auto* one = new OnePieceJob(std::move(job));
  absl::Status s = Submit(one);
  if (!s.ok()) one->Reply();  // never queued: gone here
  return s;
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
  for (auto& lane : lanes_) {
    if (lane->launch_thread.joinable()) lane->launch_thread.join();
  }
}

bool DeviceWorker::TakeJob(DeviceJob** job) {
  // Poll a little before sleeping: a request that arrives within poll_ of the last one starts
  // without a futex wake-up (tens of microseconds on a VM; PERFORMANCE.md).
  PollFor(poll_, [&] {
    return queued_.load(std::memory_order_acquire) > 0 ||
           stopping_.load(std::memory_order_relaxed);
  });
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
  if (jobs_.empty()) return false;  // stopping, and everything queued has been taken
  *job = jobs_.front();
  jobs_.pop_front();
  queued_.fetch_sub(1, std::memory_order_relaxed);
  ++running_;
  return true;
}

void DeviceWorker::LaunchLoop(Lane& lane, int completion_threads, int contexts,
                              std::promise<absl::Status>* started) {
  backend_.BindThread();
  // The lane's contexts share the first one's stream: its requests run in arrival order.
  std::vector<std::unique_ptr<ExecEnv>> envs;
  absl::Status status;
  for (int s = 0; s < contexts && status.ok(); ++s) {
    auto env = backend_.NewExecEnv(envs.empty() ? nullptr : envs.front().get());
    status = env.status();
    if (env.ok()) envs.push_back(*std::move(env));
  }
  started->set_value(status);
  if (!status.ok()) return;
  for (auto& env : envs) lane.free_slots.push_back(env.get());
  lane.free_count.store(static_cast<int>(lane.free_slots.size()));
  for (int t = 0; t < completion_threads; ++t) {
    std::thread& thread = lane.completion_threads.emplace_back(&DeviceWorker::CompletionLoop, this,
                                                               std::ref(lane));
    NameThread(thread, absl::StrCat("lane", lane.index, "-complete", t == 0 ? "" : std::to_string(t)));
  }

  for (;;) {
    // Every context busy: poll for one to come free as TakeJob polls the queue. Under load this
    // is the wait that paces the lane, and a futex wake-up would add its latency to every cycle.
    PollFor(poll_, [&] { return lane.free_count.load(std::memory_order_acquire) > 0; });
    {
      std::unique_lock<std::mutex> lock(lane.mu);
      lane.slot_freed.wait(lock, [&] { return !lane.free_slots.empty(); });
    }
    DeviceJob* job = nullptr;
    if (!TakeJob(&job)) break;
    // Only this thread takes slots, so one is still free. The one freed last is taken: its
    // staging is warm and, for back-to-back requests, its graph cache holds their graph.
    ExecEnv* env = nullptr;
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      env = lane.free_slots.back();
      lane.free_slots.pop_back();
      lane.free_count.fetch_sub(1, std::memory_order_relaxed);
      ++lane.in_flight;
      if (observer_) observer_(lane.index, lane.in_flight);
    }
    const bool launched = job->Launch(*env);
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      lane.pending.push_back({launched ? job : nullptr, env});
      lane.pending_count.fetch_add(1, std::memory_order_release);
    }
    lane.launched.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    lane.launch_done = true;
  }
  lane.launched.notify_all();
  for (std::thread& t : lane.completion_threads) t.join();
  envs.clear();  // on the thread that made them
}

void DeviceWorker::CompletionLoop(Lane& lane) {
  backend_.BindThread();  // its waits, output copies and frees go to the lane's device
  for (;;) {
    // As the launch thread does for the queue: a job launched within poll_ of the last one's
    // completion is taken without a futex wake-up.
    PollFor(poll_, [&] {
      return lane.pending_count.load(std::memory_order_acquire) > 0 ||
             stopping_.load(std::memory_order_relaxed);
    });
    Lane::Pending p;
    {
      std::unique_lock<std::mutex> lock(lane.mu);
      lane.launched.wait(lock, [&] { return !lane.pending.empty() || lane.launch_done; });
      if (lane.pending.empty()) return;
      p = std::move(lane.pending.front());
      lane.pending.pop_front();
      lane.pending_count.fetch_sub(1, std::memory_order_relaxed);
    }
    if (p.job != nullptr) p.job->Complete(*p.env);  // what the job held goes before the reply
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      lane.free_slots.push_back(p.env);
      lane.free_count.fetch_add(1, std::memory_order_release);
      --lane.in_flight;
      if (observer_) observer_(lane.index, lane.in_flight);
    }
    lane.slot_freed.notify_one();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    if (p.job != nullptr) p.job->Reply();
  }
}

}  // namespace opserve
