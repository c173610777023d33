// The device worker's lanes, without gRPC (so that the unit suite's strict ThreadSanitizer run
// sees every hand-off): several lanes take jobs from one bounded queue, each job on a lane's own
// execution context, every job's stages run once (Launch, Complete, Reply), the bound answers
// RESOURCE_EXHAUSTED, and Shutdown runs what was queued.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <latch>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/device_worker.h"

namespace opserve {
namespace {

// A job whose stages run the functions given (each may be empty); it is gone after its Reply.
class TestJob final : public DeviceJob {
 public:
  TestJob(std::function<void(ExecEnv&)> launch, std::function<void(ExecEnv&)> complete,
          std::function<void()> reply)
      : launch_(std::move(launch)), complete_(std::move(complete)), reply_(std::move(reply)) {}
  bool Launch(ExecEnv& env) override {
    if (launch_) launch_(env);
    return true;
  }
  void Complete(ExecEnv& env) override {
    if (complete_) complete_(env);
  }
  void Reply() override {
    if (reply_) reply_();
    delete this;
  }

 private:
  std::function<void(ExecEnv&)> launch_, complete_;
  std::function<void()> reply_;
};

// Queues a TestJob; one the worker refuses is deleted here.
absl::Status SubmitJob(DeviceWorker& worker, std::function<void(ExecEnv&)> launch,
                       std::function<void(ExecEnv&)> complete, std::function<void()> reply) {
  auto* job = new TestJob(std::move(launch), std::move(complete), std::move(reply));
  absl::Status s = worker.Submit(job);
  if (!s.ok()) delete job;
  return s;
}

TEST(DeviceWorkerTest, LanesRunJobsConcurrentlyEachOnItsOwnContext) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  constexpr int kLanes = 4;
  std::mutex mu;
  std::vector<int> busy_events;  // +lane+1 on start, -(lane+1) on end, from the observer
  auto worker = DeviceWorker::Start(*backend, kLanes, /*max_queue=*/64,
                                    std::chrono::microseconds(0), [&](int lane, int running) {
                                      std::lock_guard<std::mutex> lock(mu);
                                      busy_events.push_back(running ? lane + 1 : -(lane + 1));
                                    });
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->lanes(), kLanes);

  // kLanes jobs that each wait until all kLanes run at once: they can only finish if every lane
  // took one. Each records the context it ran on.
  std::latch all_running(kLanes);
  std::set<ExecEnv*> envs;
  std::atomic<int> completions{0};
  for (int i = 0; i < kLanes; ++i) {
    ASSERT_TRUE(SubmitJob(
                    **worker,
                    [&](ExecEnv& env) {
                      all_running.arrive_and_wait();
                      std::lock_guard<std::mutex> lock(mu);
                      envs.insert(&env);
                    },
                    nullptr, [&] { ++completions; })
                    .ok());
  }
  // Many small jobs from several threads, each using its context's memory and copies.
  constexpr int kThreads = 4, kJobsPerThread = 200;
  std::atomic<int> wrong{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int j = 0; j < kJobsPerThread; ++j) {
        const uint64_t value = uint64_t{1} << t | uint64_t(j) << 8;
        absl::Status s;
        do {  // the queue is bounded: retry what it refuses
          s = SubmitJob(
              **worker,
              [&, value](ExecEnv& env) {
                env.BeginRequest(0);
                auto b = env.Allocate(sizeof(value));
                if (!b.ok() || !env.CopyIn(**b, &value, sizeof(value)).ok()) ++wrong;
                (void)env.Finish(0);
                uint64_t back = 0;
                if (b.ok()) std::memcpy(&back, (*b)->data(), sizeof(back));
                if (back != value) ++wrong;
              },
              nullptr, [&] { ++completions; });
          if (!s.ok()) {
            EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
            std::this_thread::yield();
          }
        } while (!s.ok());
      }
    });
  }
  for (std::thread& t : submitters) t.join();
  (*worker)->Shutdown();  // runs everything queued
  EXPECT_EQ(completions.load(), kLanes + kThreads * kJobsPerThread);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(envs.size(), static_cast<size_t>(kLanes)) << "the lanes shared a context";
  std::set<int> lanes_seen;
  for (int e : busy_events) lanes_seen.insert(e > 0 ? e - 1 : -e - 1);
  EXPECT_EQ(lanes_seen.size(), static_cast<size_t>(kLanes));
  EXPECT_TRUE(SubmitJob(**worker, nullptr, nullptr, nullptr).code() ==
              absl::StatusCode::kUnavailable);
}

TEST(DeviceWorkerTest, TheBoundCountsJobsOnEveryLane) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  auto worker = DeviceWorker::Start(*backend, /*lanes=*/2, /*max_queue=*/3);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::latch release(1);
  std::atomic<int> started{0};
  auto blocking = [&](ExecEnv&) {
    ++started;
    release.wait();
  };
  ASSERT_TRUE((*worker)->Submit(blocking).ok());
  ASSERT_TRUE((*worker)->Submit(blocking).ok());
  ASSERT_TRUE((*worker)->Submit(blocking).ok());  // queued behind two running ones
  const absl::Status full = (*worker)->Submit(blocking);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("--max_inflight=3"), std::string::npos) << full;
  while (started.load() < 2) std::this_thread::yield();
  EXPECT_EQ((*worker)->depth(), 3);
  release.count_down();
  (*worker)->Shutdown();
  EXPECT_EQ(started.load(), 3);
}

TEST(DeviceWorkerTest, ZeroLanesIsRefused) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  auto worker = DeviceWorker::Start(*backend, /*lanes=*/0, /*max_queue=*/4);
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace opserve

namespace opserve {
namespace {

// A lane launches the next jobs while the first one's completion waits (here for a latch, on the
// GPU for the device): jobs 2..N launch before job 1 finishes. Job N+1 waits for a free context:
// a lane of N contexts holds N jobs, no more.
class LaneContextsTest : public ::testing::TestWithParam<int> {};

// A lane that launched fewer jobs than it has contexts would leave this waiting: it gives up
// after a while so that the test fails rather than hangs.
bool WaitFor(std::latch& latch) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!latch.try_wait()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST_P(LaneContextsTest, ALaneLaunchesTheNextJobsWhileTheFirstCompletes) {
  const int contexts = GetParam();
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  std::mutex mu;
  std::vector<int> most_in_flight;
  // One completion thread: completions then run in launch order.
  auto worker = DeviceWorker::Start(
      *backend, /*lanes=*/1, /*max_queue=*/16, std::chrono::microseconds(0),
      [&](int, int running) {
        std::lock_guard<std::mutex> lock(mu);
        most_in_flight.push_back(running);
      },
      /*completion_threads=*/1, contexts);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::latch others_launched(contexts - 1), release_first(1);
  std::atomic<int> extra_launched{0};
  std::set<ExecEnv*> envs;
  std::vector<int> order;  // job ids in the order their completions ran
  auto submit = [&](int id) {
    return SubmitJob(
        **worker,
        [&, id](ExecEnv& env) {
          if (id > contexts) {
            ++extra_launched;
          } else {
            std::lock_guard<std::mutex> lock(mu);
            envs.insert(&env);
          }
          if (id > 1 && id <= contexts) others_launched.count_down();
        },
        [&, id](ExecEnv&) {
          if (id == 1) {
            (void)WaitFor(others_launched);  // the device, still busy with job 1
            (void)WaitFor(release_first);
          }
        },
        [&, id] {
          std::lock_guard<std::mutex> l(mu);
          order.push_back(id);
        });
  };
  for (int id = 1; id <= contexts + 1; ++id) ASSERT_TRUE(submit(id).ok());
  // Never true if the lane waited for job 1's completion, or had fewer contexts.
  EXPECT_TRUE(WaitFor(others_launched)) << "jobs 2.." << contexts << " did not all launch";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(extra_launched.load(), 0) << "a job launched while all " << contexts
                                      << " contexts were held";
  EXPECT_EQ((*worker)->depth(), contexts + 1);
  release_first.count_down();
  (*worker)->Shutdown();
  EXPECT_EQ(extra_launched.load(), 1);
  std::vector<int> want(contexts + 1);
  for (int i = 0; i < contexts + 1; ++i) want[i] = i + 1;
  EXPECT_EQ(order, want) << "completions ran out of launch order";
  EXPECT_EQ(envs.size(), static_cast<size_t>(contexts)) << "jobs in flight shared a context";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(*std::max_element(most_in_flight.begin(), most_in_flight.end()), contexts);
}

INSTANTIATE_TEST_SUITE_P(Contexts, LaneContextsTest,
                         ::testing::Values(1, 2, DeviceWorker::kDefaultContextsPerLane,
                                           DeviceWorker::kMaxContextsPerLane),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param);
                         });

// With two completion threads, one job's reply does not hold up the next job's completion:
// here the first reply waits until the second job has replied, which one thread could never do.
TEST(DeviceWorkerTest, ASecondCompletionThreadFinishesTheNextJobWhileOneReplies) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  auto worker = DeviceWorker::Start(*backend, /*lanes=*/1, /*max_queue=*/8,
                                    std::chrono::microseconds(0), nullptr,
                                    /*completion_threads=*/2);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::atomic<bool> second_replied{false}, first_saw_second{false};
  auto reply = [&](bool first) {
    return [&, first] {
      if (!first) {
        second_replied = true;
        return;
      }
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!second_replied.load() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      first_saw_second = second_replied.load();
    };
  };
  ASSERT_TRUE(SubmitJob(**worker, nullptr, nullptr, reply(true)).ok());
  ASSERT_TRUE(SubmitJob(**worker, nullptr, nullptr, reply(false)).ok());
  (*worker)->Shutdown();
  EXPECT_TRUE(first_saw_second.load()) << "the second job's reply waited for the first's";
}

// A job that ends at its launch (Launch returns false) is neither completed nor replied, and
// its context still comes free: on a lane of one context, the next job runs.
class EndsAtLaunchJob final : public DeviceJob {
 public:
  explicit EndsAtLaunchJob(std::atomic<int>* later_stages) : later_stages_(later_stages) {}
  bool Launch(ExecEnv&) override {
    delete this;
    return false;
  }
  void Complete(ExecEnv&) override { ++*later_stages_; }
  void Reply() override { ++*later_stages_; }

 private:
  std::atomic<int>* later_stages_;
};

TEST(DeviceWorkerTest, AJobThatEndsAtItsLaunchFreesItsContext) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  auto worker = DeviceWorker::Start(*backend, /*lanes=*/1, /*max_queue=*/8,
                                    std::chrono::microseconds(0), nullptr,
                                    /*completion_threads=*/1, /*contexts=*/1);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::atomic<int> later_stages{0}, replies{0};
  ASSERT_TRUE((*worker)->Submit(new EndsAtLaunchJob(&later_stages)).ok());
  ASSERT_TRUE(SubmitJob(**worker, nullptr, nullptr, [&] { ++replies; }).ok());
  (*worker)->Shutdown();
  EXPECT_EQ(later_stages.load(), 0) << "a job that ended at its launch was completed or replied";
  EXPECT_EQ(replies.load(), 1) << "the context of the job that ended at its launch never came free";
  EXPECT_EQ((*worker)->depth(), 0);
}

TEST(DeviceWorkerTest, ZeroCompletionThreadsIsRefused) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  auto worker = DeviceWorker::Start(*backend, /*lanes=*/1, /*max_queue=*/4,
                                    std::chrono::microseconds(0), nullptr, /*completion_threads=*/0);
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceWorkerTest, ContextsOutsideTheirRangeAreRefused) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  for (int contexts : {0, DeviceWorker::kMaxContextsPerLane + 1}) {
    auto worker = DeviceWorker::Start(*backend, /*lanes=*/1, /*max_queue=*/4,
                                      std::chrono::microseconds(0), nullptr,
                                      /*completion_threads=*/1, contexts);
    EXPECT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument) << contexts;
    if (!worker.ok()) EXPECT_TRUE(absl::StrContains(worker.status().message(), "contexts")) << contexts;
  }
}

}  // namespace
}  // namespace opserve
