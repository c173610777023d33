#include "server/rpc/socket_drain.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <thread>

namespace opserve {

uint64_t UnacknowledgedSocketBytes() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;  // no /proc: nothing to wait for
  uint64_t total = 0;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    // TCP only: a Unix stream socket (stderr to journald, say) is not a client's connection.
    int type = 0, domain = 0;
    socklen_t len = sizeof type;
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    len = sizeof domain;
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
        (domain != AF_INET && domain != AF_INET6)) {
      continue;
    }
    int queued = 0;  // fails with EINVAL on a listening socket: nothing queued there
    if (ioctl(static_cast<int>(fd), SIOCOUTQ, &queued) == 0 && queued > 0) {
      total += static_cast<uint64_t>(queued);
    }
  }
  closedir(dir);
  return total;
}

bool WaitForSocketsToFlush(std::chrono::system_clock::time_point deadline) {
  for (;;) {
    if (UnacknowledgedSocketBytes() == 0) return true;
    if (std::chrono::system_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace opserve
