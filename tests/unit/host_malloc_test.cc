// RetainFreedHostMemory: a second large request reuses the pages the first one faulted in, where
// glibc's defaults give them back and fault them in anew. Each measurement runs in a forked child,
// so that this process keeps glibc's defaults whatever order the tests run in.
#include "server/rpc/host_malloc.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/sanitized.h"
#include "gtest/gtest.h"

namespace opserve {
namespace {

constexpr bool kSanitized = OPSERVE_SANITIZED;

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// The page faults of one 128 MiB message received as gRPC does: blocks of 256 KiB (its read
// slices grow up to a few MiB) allocated, written, then freed together. On a thread that spans
// three of its arena's 64 MiB heaps, which with glibc's trim and mmap thresholds alone it unmaps
// or shrinks once empty: half the pages faulted in again (measured on the development VM).
long FaultsOfOneMessage() {
  const long before = MinorFaults();
  std::vector<char*> blocks;
  constexpr size_t kBlock = 256 << 10;
  for (int i = 0; i < 512; ++i) {
    char* p = static_cast<char*>(std::malloc(kBlock));
    std::memset(p, i + 1, kBlock);
    blocks.push_back(p);
  }
  for (char* p : blocks) std::free(p);
  return MinorFaults() - before;
}

// In a child: RetainFreedHostMemory(retain) (unless -1), one message to warm up, then the faults
// of the next one; on the main thread (glibc's main arena) or on a thread of its own (an arena of
// its own, whose heaps glibc unmaps once empty: how gRPC's threads receive).
long FaultsOfASecondMessage(int64_t retain, bool on_a_thread) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    long faults = -1;
    if (retain < 0 || RetainFreedHostMemory(static_cast<uint64_t>(retain)).ok()) {
      auto two = [&faults] {
        FaultsOfOneMessage();
        faults = FaultsOfOneMessage();
      };
      if (on_a_thread) {
        std::thread(two).join();
      } else {
        two();
      }
    }
    (void)!write(fds[1], &faults, sizeof(faults));
    _exit(0);
  }
  close(fds[1]);
  long faults = -1;
  if (pid < 0 || read(fds[0], &faults, sizeof(faults)) != sizeof(faults)) faults = -1;
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return faults;
}

class HostMallocTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (kSanitized) GTEST_SKIP() << "a sanitizer's allocator replaces glibc's malloc";
    defaults_ = FaultsOfASecondMessage(-1, GetParam());
    ASSERT_GE(defaults_, 0);
    // 128 MiB is 32768 pages of 4 KiB; transparent huge pages on every mapping ("always") would
    // leave little for retention to save.
    if (defaults_ < 8192) GTEST_SKIP() << "glibc's defaults fault only " << defaults_ << " times";
  }
  long defaults_ = 0;
};

TEST_P(HostMallocTest, ASecondLargeMessageReusesTheFirstOnesPages) {
  const long retained = FaultsOfASecondMessage(int64_t{256} << 20, GetParam());
  ASSERT_GE(retained, 0);
  EXPECT_LT(retained * 8, defaults_) << "glibc's defaults " << defaults_ << " faults, retained "
                                     << retained;
}

TEST_P(HostMallocTest, ZeroLeavesGlibcsDefaults) {
  const long zero = FaultsOfASecondMessage(0, GetParam());
  ASSERT_GE(zero, 0);
  EXPECT_GT(zero * 2, defaults_) << "glibc's defaults " << defaults_ << ", with 0 " << zero;
}

INSTANTIATE_TEST_SUITE_P(MainArenaAndThreadArena, HostMallocTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("OnAThread") : std::string("OnMain");
                         });

}  // namespace
}  // namespace opserve
