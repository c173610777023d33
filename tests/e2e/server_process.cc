#include "tests/e2e/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace opserve::e2e {
namespace {

constexpr char kListening[] = "opserve: listening on ";

// The port at the end of "opserve: listening on HOST:PORT", if `output` holds that whole line.
int ParsePort(const std::string& output) {
  const size_t at = output.find(kListening);
  if (at == std::string::npos) return 0;
  const size_t eol = output.find('\n', at);
  if (eol == std::string::npos) return 0;  // not the whole line yet
  const std::string line = output.substr(at, eol - at);
  const size_t colon = line.rfind(':');
  if (colon == std::string::npos) return -1;
  return std::atoi(line.c_str() + colon + 1);
}

}  // namespace

std::string OpserveBinary() {
  const char* env = std::getenv("OPSERVE_BIN");
  if (env != nullptr && *env != '\0') return env;
  return OPSERVE_BIN_DEFAULT;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& binary, const std::vector<std::string>& flags,
    std::chrono::milliseconds timeout, int signal_when_listening) {
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("no executable opserve at ", binary));
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));

  std::vector<std::string> args = {binary};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // The child's stdout and stderr both go to the pipe; dup2 clears O_CLOEXEC on 1 and 2.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", strerror(rc)));
  }

  std::unique_ptr<ServerProcess> p(new ServerProcess());
  p->pid_ = pid;
  p->out_fd_ = fds[0];
  p->signal_when_listening_ = signal_when_listening;
  p->reader_ = std::thread(&ServerProcess::ReadOutput, p.get());

  std::unique_lock<std::mutex> lock(p->mu_);
  const bool ready =
      p->cv_.wait_for(lock, timeout, [&] { return p->eof_ || ParsePort(p->output_) != 0; });
  const int port = ParsePort(p->output_);
  const std::string output = p->output_;
  lock.unlock();
  if (!ready || port <= 0) {
    return absl::DeadlineExceededError(absl::StrCat("opserve did not print a listening line ",
                                                    ready ? "before exiting" : "in time",
                                                    "; its output:\n", output));
  }
  p->port_ = port;
  return p;
}

ServerProcess::~ServerProcess() {
  if (Alive()) {
    kill(pid_, SIGKILL);
    (void)WaitForExit(std::chrono::seconds(10));
  }
  if (reader_.joinable()) reader_.join();  // EOF once the child is gone
  if (out_fd_ >= 0) close(out_fd_);
}

void ServerProcess::ReadOutput() {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (n <= 0) {
      eof_ = true;
      cv_.notify_all();
      return;
    }
    const bool was_listening = ParsePort(output_) != 0;
    output_.append(buf, static_cast<size_t>(n));
    if (signal_when_listening_ != 0 && !was_listening && ParsePort(output_) != 0) {
      kill(pid_, signal_when_listening_);  // not reaped yet: the pid is still the child's
    }
    cv_.notify_all();
  }
}

bool ServerProcess::Alive() {
  if (wait_status_.has_value() || pid_ <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    wait_status_ = status;
    return false;
  }
  return r == 0;
}

void ServerProcess::Signal(int signal) {
  if (Alive()) kill(pid_, signal);
}

absl::StatusOr<int> ServerProcess::WaitForExit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Alive()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("opserve (pid ", pid_, ") still running after ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!wait_status_.has_value()) return absl::InternalError("lost track of the child");
  return *wait_status_;
}

std::string ServerProcess::Output() const {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

// "opserve: metrics on port N at /metrics", printed before the listening line.
int ParseMetricsPort(const std::string& output) {
  constexpr char kLine[] = "opserve: metrics on port ";
  const size_t at = output.find(kLine);
  if (at == std::string::npos) return 0;
  return std::atoi(output.c_str() + at + sizeof(kLine) - 1);
}

// GET /metrics over a plain socket (HTTP/1.0: the server closes when done).
absl::StatusOr<std::string> HttpGetMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to metrics port ", port, ": ", strerror(errno)));
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("sending the metrics request failed");
  }
  std::string response;
  char buf[16384];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) {
      close(fd);
      return absl::DeadlineExceededError("the metrics endpoint did not answer in 10 s");
    }
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError("not an HTTP response from the metrics endpoint");
  }
  return response.substr(body + 4);
}

}  // namespace opserve::e2e
