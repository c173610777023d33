// GuardedCopy (server/engine/guarded_copy.h) on a real file mapping whose file is truncated under
// it, as a client can do to its shm object mid-request: the copy fails with a status naming the
// side that went away, the thread carries on, and other copies still work. A SIGBUS outside a
// guarded copy still ends the process.
#include "server/engine/guarded_copy.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/sanitized.h"

namespace opserve {
namespace {

constexpr bool kSanitized = OPSERVE_SANITIZED;

// A shared mapping of a 4-page memory file, its file then cut to `keep` bytes.
struct ShrunkMapping {
  explicit ShrunkMapping(size_t keep) {
    fd = memfd_create("guarded_copy_test", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kBytes), 0);
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    data = static_cast<char*>(p);
    std::memset(data, 7, kBytes);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(keep)), 0);
  }
  ~ShrunkMapping() {
    munmap(data, kBytes);
    close(fd);
  }
  static constexpr size_t kBytes = 4 * 4096;
  int fd = -1;
  char* data = nullptr;
};

TEST(GuardedCopy, CopiesLikeMemcpy) {
  std::vector<char> a(10000), b(10000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(GuardedCopy(b.data(), a.data(), a.size()).ok());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(GuardedCopy(nullptr, nullptr, 0).ok());
}

TEST(GuardedCopy, ASourceTruncatedUnderItIsAnErrorNotACrash) {
  ShrunkMapping m(4096);  // pages 1-3 are gone
  std::vector<char> out(ShrunkMapping::kBytes);
  const absl::Status s = GuardedCopy(out.data(), m.data, out.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("source"), std::string::npos) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  // The handler left SIGBUS unblocked: the same fault is caught again.
  EXPECT_FALSE(GuardedCopy(out.data(), m.data + 4096, 4096).ok());
  EXPECT_TRUE(GuardedCopy(out.data(), m.data, 4096).ok()) << "the page that is left still copies";
}

TEST(GuardedCopy, ADestinationTruncatedUnderItIsAnErrorNotACrash) {
  ShrunkMapping m(0);
  std::vector<char> in(8192, 1);
  const absl::Status s = GuardedCopy(m.data, in.data(), in.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("destination"), std::string::npos) << s;
}

TEST(GuardedCopy, ThreadsFaultingAtOnceEachGetTheirOwnError) {
  ShrunkMapping m(4096);
  std::vector<int> failed(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> out(ShrunkMapping::kBytes);
      for (int i = 0; i < 50; ++i) failed[t] += !GuardedCopy(out.data(), m.data, out.size()).ok();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failed[t], 50) << "thread " << t;
}

TEST(GuardedCopyDeathTest, ASigbusOutsideAGuardedCopyStillEndsTheProcess) {
  // Under a sanitizer the fault would end in the sanitizer's own report, which the CI treats as
  // a failure of the suite: the plain builds check this.
  if (kSanitized) GTEST_SKIP() << "the sanitizer's deadly-signal report would count as a finding";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ShrunkMapping m(0);
  std::vector<char> out(16);
  ASSERT_TRUE(GuardedCopy(out.data(), out.data() + 8, 8).ok());  // the handler is installed
  EXPECT_EXIT(
      {
        volatile char c = m.data[100];
        (void)c;
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
}  // namespace opserve
