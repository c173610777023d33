// What the service sections of opserve-bench share (service_bench.cc, concurrency_bench.cc):
// the real `opserve` as a child process on loopback, gRPC's own floor (a raw unary
// grpc.health.v1.Health/Check), random inputs and percentiles.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/opserve_client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"

extern char** environ;

namespace opserve::bench {

using Clock = std::chrono::steady_clock;


inline constexpr char kListening[] = "opserve: listening on ";
inline constexpr char kHttpOn[] = "opserve: HTTP on ";

inline double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// opserve as a child process: its output drained by a thread, its port read from the
// "listening on" line, SIGTERM (then SIGKILL) when this object goes.
class Server {
 public:
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (i == 99) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status, 0);
        }
      }
    }
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) close(fd_);
  }

  std::string Start(const std::string& bin, const std::vector<std::string>& extra) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::StrCat("pipe: ", std::strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    std::vector<std::string> args = {bin, "--device=cuda", "--host=127.0.0.1", "--port=0",
                                     "--metrics_port=-1", "--http_port=-1"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    fd_ = fds[0];
    if (rc != 0) {
      pid_ = -1;
      return absl::StrCat("cannot start ", bin, ": ", std::strerror(rc));
    }
    reader_ = std::thread([this] {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd_, buf, sizeof(buf))) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        output_.append(buf, n);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      eof_ = true;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    const bool ready = cv_.wait_for(lock, std::chrono::seconds(60), [&] {
      const size_t at = output_.find(kListening);
      return eof_ || (at != std::string::npos && output_.find('\n', at) != std::string::npos);
    });
    const size_t at = output_.find(kListening);
    if (!ready || at == std::string::npos) {
      return absl::StrCat("opserve did not print its listening line; it said: ", output_);
    }
    const std::string line = output_.substr(at, output_.find('\n', at) - at);
    port_ = std::atoi(line.substr(line.rfind(':') + 1).c_str());
    // With --http_port, its line comes first.
    if (const size_t h = output_.find(kHttpOn); h != std::string::npos && h < at) {
      const std::string http = output_.substr(h, output_.find('\n', h) - h);
      http_port_ = std::atoi(http.substr(http.rfind(':') + 1).c_str());
    }
    return port_ > 0 ? "" : absl::StrCat("no port in: ", line);
  }

  int port() const { return port_; }
  int http_port() const { return http_port_; }  // 0 without --http_port

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  int http_port_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
};

// Random float32 bytes in [-1, 1), never zero (a fast xorshift: a GiB takes well under a second).
inline std::string RandomFloats(uint64_t count) {
  std::string bytes(count * sizeof(float), '\0');
  auto* p = reinterpret_cast<float*>(bytes.data());
  uint64_t x = std::random_device{}() | 1;
  for (uint64_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float v = static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
    p[i] = v == 0.0f ? 0.5f : v;
  }
  return bytes;
}

// gRPC's floor: a unary Health/Check (empty request: the whole server) made as Client::Execute
// makes its calls, through the blocking path of generated stubs, where the calling thread waits
// on a completion queue of its own. (A callback call waited on with a future took 10-21% longer
// at one client on the GPU hosts; at 16 and 64 clients the two forms were within the noise:
// docs/performance/history.md, "The service under concurrent load".)
inline bool HealthCheck(grpc::ChannelInterface* channel) {
  static const grpc::internal::RpcMethod kMethod("/grpc.health.v1.Health/Check",
                                                 grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
             channel, kMethod, &context, request, &response)
      .ok();
}

// Execute of one row_mean node (algorithm auto) on the stored tensor `name`, returned inline.
inline v1::ExecuteRequest RowMeanOfStored(const std::string& name) {
  v1::ExecuteRequest req;
  v1::Node* node = req.add_nodes();
  node->set_id("m");
  node->set_op("row_mean");
  node->set_algorithm("auto");
  node->add_inputs()->set_stored(name);
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("m");
  out->set_return_inline(true);
  return req;
}

// A started server, a client library connection to it (one channel) and a plain channel of
// default arguments for generated stubs.
struct Session {
  Server server;
  std::unique_ptr<client::Client> client;
  std::shared_ptr<grpc::Channel> raw_channel;

  // Starts `bin` with `args` and connects; "" on success, else why not.
  std::string Open(const std::string& bin, const std::vector<std::string>& args,
                   int64_t chunk_bytes = 0, const std::map<std::string, int>& channel_args = {}) {
    if (std::string err = server.Start(bin, args); !err.empty()) return err;
    client::ClientOptions co;
    co.target = absl::StrCat("127.0.0.1:", server.port());
    co.channel_args = channel_args;
    if (chunk_bytes > 0) co.chunk_bytes = chunk_bytes;
    auto conn = client::Client::Connect(co);
    if (!conn.ok()) return std::string(conn.status().message());
    client = *std::move(conn);
    raw_channel = grpc::CreateChannel(co.target, grpc::InsecureChannelCredentials());
    return "";
  }
};

}  // namespace opserve::bench
