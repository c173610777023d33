// server/socket_drain: the drain on SIGTERM closes connections only once the peers have every
// byte queued for them. Checked on a real loopback TCP connection whose reader stalls.
#include "server/rpc/socket_drain.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

namespace opserve {
namespace {

// A connected loopback TCP pair: `writer` in this process sends, `reader` receives.
struct Connection {
  int listener = -1, writer = -1, reader = -1;
  ~Connection() {
    for (int fd : {listener, writer, reader}) {
      if (fd >= 0) close(fd);
    }
  }
};

::testing::AssertionResult Connect(Connection& c) {
  c.listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (c.listener < 0 || bind(c.listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(c.listener, 1) != 0 ||
      getsockname(c.listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ::testing::AssertionFailure() << "listen: " << strerror(errno);
  }
  c.writer = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c.writer < 0) return ::testing::AssertionFailure() << "socket: " << strerror(errno);
  if (connect(c.writer, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    return ::testing::AssertionFailure() << "connect: " << strerror(errno);
  }
  c.reader = accept4(c.listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (c.reader < 0) return ::testing::AssertionFailure() << "accept: " << strerror(errno);
  return ::testing::AssertionSuccess();
}

// Writes until the kernel takes no more: the reader's receive buffer and this side's send
// buffer are full, so bytes sit unacknowledged in the send queue. The bytes written.
size_t FillUntilBlocked(int fd) {
  const std::string block(64 * 1024, 'x');
  size_t total = 0;
  for (int idle = 0; idle < 20;) {
    const ssize_t n = send(fd, block.data(), block.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      total += static_cast<size_t>(n);
      idle = 0;
    } else {
      ++idle;  // the window may still open a little as the reader's kernel catches up
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return total;
}

size_t DrainAll(int fd, size_t want) {
  std::string buf(1 << 20, '\0');
  size_t got = 0;
  while (got < want) {
    const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

TEST(SocketDrainTest, NothingQueuedOnAnIdleConnection) {
  Connection c;
  ASSERT_TRUE(Connect(c));
  EXPECT_EQ(UnacknowledgedSocketBytes(), 0u);
  EXPECT_TRUE(WaitForSocketsToFlush(std::chrono::system_clock::now() + std::chrono::seconds(5)));
}

// Only TCP connections count: a stalled Unix socket (stderr to a log daemon, say) is not a
// client waiting for a response, and must not hold the drain.
TEST(SocketDrainTest, AStalledUnixSocketIsNotWaitedFor) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  EXPECT_GT(FillUntilBlocked(fds[0]), 0u);
  EXPECT_EQ(UnacknowledgedSocketBytes(), 0u);
  close(fds[0]);
  close(fds[1]);
}

TEST(SocketDrainTest, WaitsWhileAReaderStallsAndReturnsOnceItHasRead) {
  Connection c;
  ASSERT_TRUE(Connect(c));
  const size_t written = FillUntilBlocked(c.writer);
  ASSERT_GT(written, 0u);
  // The reader has read nothing: its receive buffer is full and the rest is unacknowledged.
  EXPECT_GT(UnacknowledgedSocketBytes(), 0u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(WaitForSocketsToFlush(std::chrono::system_clock::now() + std::chrono::milliseconds(200)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));

  // Once the reader takes everything, the wait ends well before its deadline.
  std::thread reader([&] { EXPECT_EQ(DrainAll(c.reader, written), written); });
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitForSocketsToFlush(std::chrono::system_clock::now() + std::chrono::seconds(20)));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(10));
  reader.join();
  EXPECT_EQ(UnacknowledgedSocketBytes(), 0u);
}

}  // namespace
}  // namespace opserve
