// The real `opserve` binary as a child process: started with posix_spawn, its stdout and stderr
// read through a pipe by a thread (so the server never blocks on a full pipe), its port taken
// from the "opserve: listening on HOST:PORT" line within a bounded wait, and killed if it is
// still running when the object goes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace opserve::e2e {

class ServerProcess {
 public:
  // Starts `binary` with `flags` and waits up to `timeout` for it to listen. A nonzero
  // `signal_when_listening` is sent by the output reader the instant the listening line
  // arrives, as a supervisor watching the log would.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& binary, const std::vector<std::string>& flags,
      std::chrono::milliseconds timeout = std::chrono::seconds(20), int signal_when_listening = 0);
  ~ServerProcess();

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

  // True while the child has not exited.
  bool Alive();
  // Sends `signal`.
  void Signal(int signal);
  // Waits up to `timeout` for the child to exit; its wait status, or DEADLINE_EXCEEDED.
  absl::StatusOr<int> WaitForExit(std::chrono::milliseconds timeout);
  // Everything the server printed so far (stdout and stderr together).
  std::string Output() const;

 private:
  ServerProcess() = default;
  void ReadOutput();

  pid_t pid_ = -1;
  int port_ = 0;
  int out_fd_ = -1;
  int signal_when_listening_ = 0;
  std::optional<int> wait_status_;  // set once reaped
  std::thread reader_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
};

// The opserve binary: $OPSERVE_BIN, else the one this build produced.
std::string OpserveBinary();

// The metrics port a server started with --metrics_port=0 printed ("opserve: metrics on port
// N at /metrics", before its listening line); 0 when it printed none.
int ParseMetricsPort(const std::string& output);
// GET /metrics on 127.0.0.1:`port`: the text exposition.
absl::StatusOr<std::string> HttpGetMetrics(int port);

}  // namespace opserve::e2e
