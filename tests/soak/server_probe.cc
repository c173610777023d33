#include "tests/soak/server_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace opserve::soak {
namespace {

constexpr char kMetricsLine[] = "opserve: metrics on port ";
// A /metrics page is a few tens of KiB; anything past this is not one.
constexpr size_t kMaxResponseBytes = 16 << 20;

// Closes a socket on every path out.
class Socket {
 public:
  Socket() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<uint64_t> ResidentBytes(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    if (!absl::ConsumeSuffix(&rest, "kB")) break;
    uint64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) break;
    return kib * 1024;
  }
  return absl::InternalError(absl::StrCat("no VmRSS line in ", path));
}

absl::StatusOr<int> MetricsPort(const std::string& server_output) {
  const size_t at = server_output.find(kMetricsLine);
  int port = 0;
  if (at != std::string::npos) {
    const size_t begin = at + sizeof(kMetricsLine) - 1;
    const size_t end = server_output.find_first_not_of("0123456789", begin);
    if (!absl::SimpleAtoi(server_output.substr(begin, end - begin), &port)) port = 0;
  }
  if (port <= 0) {
    return absl::NotFoundError(absl::StrCat("the server printed no '", kMetricsLine, "N' line"));
  }
  return port;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout) {
  Socket s;
  if (s.fd() < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(s.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return absl::UnavailableError(absl::StrCat("connect to port ", port, ": ", strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (send(s.fd(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
  }
  std::string response;
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(s.fd(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DeadlineExceededError(absl::StrCat("recv: ", strerror(errno)));
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
    if (response.size() > kMaxResponseBytes) {
      return absl::OutOfRangeError("the response is larger than any /metrics page");
    }
  }
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos ||
      response.find(" 200 ") > response.find("\r\n")) {
    return absl::InternalError(
        absl::StrCat("GET ", path, ": ", response.substr(0, response.find("\r\n"))));
  }
  return response.substr(body + 4);
}

absl::StatusOr<double> SampleValue(const std::string& exposition, absl::string_view family,
                                   absl::string_view label) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, family) || line.size() <= family.size() ||
        line[family.size()] != '{' || !absl::StrContains(line, label)) {
      continue;
    }
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &value)) {
      return value;
    }
  }
  return absl::NotFoundError(absl::StrCat("no sample of ", family, " with ", label));
}

}  // namespace opserve::soak
