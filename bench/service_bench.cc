// The service path over loopback gRPC: the real `opserve` binary (--device=cuda --port=0), the
// client library, and a raw unary grpc.health.v1.Health/Check as gRPC's own floor.
//
//   - Execute of one row_mean node (algorithm auto) on a stored 4096x4096 FLOAT32 tensor, the
//     16 KiB result returned inline: end-to-end p50/p99 against the node's kernel_us.
//   - Health/Check to the same server in the same loop (interleaved call by call, so both see the
//     same machine state): through a raw unary call on its own channel (the floor the target
//     uses) and through the client library's HealthServing.
//   - PutTensor and GetTensor of a 1 GiB tensor: bytes over the call's wall time.
#include "bench/service_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/opserve_client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"

extern char** environ;

namespace opserve::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kListening[] = "opserve: listening on ";
constexpr int64_t kRows = 4096, kCols = 4096;
constexpr uint64_t kTransferBytes = 1ull << 30;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
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
                                     "--metrics_port=-1"};
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
    return port_ > 0 ? "" : absl::StrCat("no port in: ", line);
  }

  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
};

// Random float32 bytes in [-1, 1), never zero (a fast xorshift: a GiB takes well under a second).
std::string RandomFloats(uint64_t count) {
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

// A plain unary Health/Check (empty request: the whole server) on `stub`: gRPC's floor.
bool RawHealthCheck(grpc::GenericStub* stub) {
  grpc::ClientContext context;
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  stub->UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                  &response, [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get().ok();
}

}  // namespace

ServiceFigures RunServiceBench(const ServiceOptions& opt) {
  ServiceFigures f;
  Server server;
  if (std::string err = server.Start(opt.opserve_bin, opt.server_args); !err.empty()) {
    f.error = err;
    return f;
  }
  client::ClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", server.port());
  if (opt.chunk_bytes > 0) co.chunk_bytes = opt.chunk_bytes;
  auto conn = client::Client::Connect(co);
  if (!conn.ok()) {
    f.error = std::string(conn.status().message());
    return f;
  }
  client::Client& c = **conn;
  auto raw_channel = grpc::CreateChannel(co.target, grpc::InsecureChannelCredentials());
  grpc::GenericStub raw(raw_channel);
  for (int i = 0;; ++i) {
    auto h = c.HealthServing();
    if (h.ok() && *h) break;
    if (i == 200) {
      f.error = "the server never reported SERVING";
      return f;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  // The stored operand of the Execute loop.
  {
    const std::string x = RandomFloats(kRows * kCols);
    const int64_t shape[] = {kRows, kCols};
    auto put = c.PutTensor("bench_x", v1::FLOAT32, shape, x.data(), x.size(), /*overwrite=*/true);
    if (!put.ok()) {
      f.error = absl::StrCat("PutTensor 4096x4096: ", put.status().message());
      return f;
    }
  }
  v1::ExecuteRequest req;
  v1::Node* node = req.add_nodes();
  node->set_id("m");
  node->set_op("row_mean");
  node->set_algorithm("auto");
  node->add_inputs()->set_stored("bench_x");
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("m");
  out->set_return_inline(true);

  std::vector<double> exec_us, kernel_us, health_us, raw_health_us;
  std::vector<double> s_total, s_queue, s_input, s_compute, s_output;
  for (int i = 0; i < opt.warmups + opt.executes; ++i) {
    const auto t0 = Clock::now();
    auto resp = c.Execute(req);
    const auto t1 = Clock::now();
    const bool raw_ok = RawHealthCheck(&raw);
    const auto t2 = Clock::now();
    auto h = c.HealthServing();
    const auto t3 = Clock::now();
    if (!resp.ok() || resp->nodes_size() != 1) {
      f.error = absl::StrCat("Execute: ", resp.ok() ? "no node result" : resp.status().message());
      return f;
    }
    if (!raw_ok || !h.ok()) {
      f.error = "Health/Check failed";
      return f;
    }
    if (i < opt.warmups) continue;
    f.algorithm = resp->nodes(0).algorithm();
    exec_us.push_back(Us(t1 - t0));
    kernel_us.push_back(resp->nodes(0).kernel_us());
    raw_health_us.push_back(Us(t2 - t1));
    health_us.push_back(Us(t3 - t2));
    s_total.push_back(resp->timing().total_us());
    s_queue.push_back(resp->timing().queue_us());
    s_input.push_back(resp->timing().input_us());
    s_compute.push_back(resp->timing().compute_us());
    s_output.push_back(resp->timing().output_us());
  }
  f.executes = static_cast<int>(exec_us.size());
  f.health_checks = static_cast<int>(raw_health_us.size());
  f.execute_p50_us = Percentile(exec_us, 0.5);
  f.execute_p99_us = Percentile(exec_us, 0.99);
  f.kernel_p50_us = Percentile(kernel_us, 0.5);
  f.overhead_p50_us = f.execute_p50_us - f.kernel_p50_us;
  f.health_p50_us = Percentile(raw_health_us, 0.5);
  f.health_p99_us = Percentile(raw_health_us, 0.99);
  f.client_health_p50_us = Percentile(health_us, 0.5);
  f.server_total_p50_us = Percentile(s_total, 0.5);
  f.server_queue_p50_us = Percentile(s_queue, 0.5);
  f.server_input_p50_us = Percentile(s_input, 0.5);
  f.server_compute_p50_us = Percentile(s_compute, 0.5);
  f.server_output_p50_us = Percentile(s_output, 0.5);
  (void)c.DeleteTensor("bench_x");

  // 1 GiB up and down.
  {
    const std::string big = RandomFloats(kTransferBytes / sizeof(float));
    const int64_t shape[] = {static_cast<int64_t>(kTransferBytes / sizeof(float))};
    for (int i = 0; i < opt.transfer_reps; ++i) {
      const auto t0 = Clock::now();
      auto put = c.PutTensor("bench_big", v1::FLOAT32, shape, big.data(), big.size(),
                             /*overwrite=*/true);
      const auto t1 = Clock::now();
      if (!put.ok()) {
        f.error = absl::StrCat("PutTensor 1 GiB: ", put.status().message());
        return f;
      }
      f.put_gbps_all.push_back(kTransferBytes / (Us(t1 - t0) * 1e-6) / 1e9);
    }
    for (int i = 0; i < opt.transfer_reps; ++i) {
      const auto t0 = Clock::now();
      auto got = c.GetTensor("bench_big");
      const auto t1 = Clock::now();
      if (!got.ok() || got->data.size() != kTransferBytes) {
        f.error = absl::StrCat("GetTensor 1 GiB: ", got.ok() ? "wrong size" : got.status().message());
        return f;
      }
      if (i == 0 && std::memcmp(got->data.data(), big.data(), kTransferBytes) != 0) {
        f.error = "GetTensor 1 GiB returned other bytes than PutTensor sent";
        return f;
      }
      f.get_gbps_all.push_back(kTransferBytes / (Us(t1 - t0) * 1e-6) / 1e9);
    }
    (void)c.DeleteTensor("bench_big");
  }
  f.put_gbps = Percentile(f.put_gbps_all, 0.5);
  f.get_gbps = Percentile(f.get_gbps_all, 0.5);
  f.ran = true;
  return f;
}

}  // namespace opserve::bench
