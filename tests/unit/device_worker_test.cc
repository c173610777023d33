// The device worker's lanes, without gRPC (so that the unit suite's strict ThreadSanitizer run
// sees every hand-off): several lanes take jobs from one bounded queue, each job on a lane's own
// execution context, every completion runs once, the bound answers RESOURCE_EXHAUSTED, and
// Shutdown runs what was queued.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <latch>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "server/engine/cpu_backend.h"
#include "server/engine/device_worker.h"

namespace opserve {
namespace {

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
    ASSERT_TRUE((*worker)
                    ->Submit([&](ExecEnv& env) -> DeviceWorker::Completion {
                      all_running.arrive_and_wait();
                      {
                        std::lock_guard<std::mutex> lock(mu);
                        envs.insert(&env);
                      }
                      return [&] { ++completions; };
                    })
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
          s = (*worker)->Submit([&, value](ExecEnv& env) -> DeviceWorker::Completion {
            env.BeginRequest();
            auto b = env.Allocate(sizeof(value));
            if (!b.ok() || !env.CopyIn(**b, &value, sizeof(value)).ok()) ++wrong;
            (void)env.Finish(0);
            uint64_t back = 0;
            if (b.ok()) std::memcpy(&back, (*b)->data(), sizeof(back));
            if (back != value) ++wrong;
            return [&] { ++completions; };
          });
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
  EXPECT_TRUE((*worker)->Submit([](ExecEnv&) { return DeviceWorker::Completion(); }).code() ==
              absl::StatusCode::kUnavailable);
}

TEST(DeviceWorkerTest, TheBoundCountsJobsOnEveryLane) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(0);
  auto worker = DeviceWorker::Start(*backend, /*lanes=*/2, /*max_queue=*/3);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::latch release(1);
  std::atomic<int> started{0};
  auto blocking = [&](ExecEnv&) -> DeviceWorker::Completion {
    ++started;
    release.wait();
    return nullptr;
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
