// ReceivePool (server/rpc/receive_pool.h): blocks are reused, idle ones are bounded, and blocks
// stay valid past the pool's owner.
#include "server/rpc/receive_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace opserve {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(ReceivePool, AReleasedBlockIsHandedOutAgain) {
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  auto a = pool->Acquire(3 * kMiB + 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes(), 3 * kMiB + 5);
  std::memset(a->data(), 0x5a, a->bytes());  // the whole block is writable
  char* const first = a->data();
  EXPECT_EQ(pool->cached_bytes(), 0u);
  a->Reset();
  EXPECT_GE(pool->cached_bytes(), 3 * kMiB + 5);
  auto b = pool->Acquire(3 * kMiB);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

TEST(ReceivePool, AnIdleBlockTooSmallOrTwiceTooLargeIsNotUsed) {
  auto pool = ReceivePool::Create(nullptr, 256 * kMiB);
  char* small_ptr = nullptr;
  char* large_ptr = nullptr;
  {
    auto small = pool->Acquire(kMiB);
    auto large = pool->Acquire(64 * kMiB);
    ASSERT_TRUE(small.ok() && large.ok());
    small_ptr = small->data();
    large_ptr = large->data();
  }
  auto mid = pool->Acquire(8 * kMiB);  // the small one does not fit; the large one wastes 7/8
  ASSERT_TRUE(mid.ok());
  EXPECT_NE(mid->data(), small_ptr);
  EXPECT_NE(mid->data(), large_ptr);
  auto big = pool->Acquire(40 * kMiB);  // the large one: at most twice the size asked
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->data(), large_ptr);
}

TEST(ReceivePool, IdleBlocksBeyondTheCapAreUnmappedOldestFirst) {
  auto pool = ReceivePool::Create(nullptr, 8 * kMiB);
  char* second = nullptr;
  {
    auto a = pool->Acquire(6 * kMiB);
    auto b = pool->Acquire(6 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok());
    second = b->data();
    a->Reset();  // idle: 6 MiB
    b->Reset();  // idle: 12 MiB > 8, so the older one goes
  }
  EXPECT_LE(pool->cached_bytes(), 8 * kMiB);
  EXPECT_GT(pool->cached_bytes(), 0u);
  auto c = pool->Acquire(6 * kMiB);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data(), second);
}

TEST(ReceivePool, ABlockOutlivesTheLastOtherOwnerOfThePool) {
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  auto a = pool->Acquire(2 * kMiB);
  ASSERT_TRUE(a.ok());
  pool.reset();
  std::memset(a->data(), 1, a->bytes());
  ReceivePool::Block moved = *std::move(a);
  EXPECT_FALSE(moved.empty());
  moved.Reset();  // frees the pool itself (ASan would see a use after free or a leak)
  EXPECT_TRUE(moved.empty());
}

TEST(ReceivePool, ThreadsNeverShareABlock) {
  auto pool = ReceivePool::Create(nullptr, 32 * kMiB);
  constexpr int kThreads = 4;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        auto b = pool->Acquire((1 + (i + t) % 3) * kMiB);
        if (!b.ok()) {
          ++bad[t];
          continue;
        }
        std::memset(b->data(), t + 1, b->bytes());
        std::this_thread::yield();
        for (uint64_t j = 0; j < b->bytes(); j += 4093) bad[t] += b->data()[j] != t + 1;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(pool->cached_bytes(), 32 * kMiB);
}

}  // namespace
}  // namespace opserve
