// A mixed load against a real server, through the C++ client: each of --threads threads loops
// PutTensor, GetTensor, Execute (row_sum of the stored tensor) and DeleteTensor on a tensor of
// its own of --mib MiB, for --seconds; then each RPC's latency percentiles. Not a test: it tells
// whether a slow RPC under load is the server's or the client's, by running the same load with
// the client's transfer settings changed (--window: the download stream window; 65535 is gRPC's
// default, which the Python client keeps; 0 leaves the C++ client's 64 MiB).
//
//   mixed_load --target=127.0.0.1:50051 [--threads=32] [--mib=4] [--seconds=20] [--window=N]
//              [--chunk_bytes=N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "client/opserve_client.h"

namespace {

using opserve::client::Client;
using opserve::client::ClientOptions;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string target = "127.0.0.1:50051";
  int threads = 32;
  int mib = 4;
  double seconds = 20;
  int window = 0;
  int64_t chunk_bytes = 0;
};

bool Parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string key = arg.substr(0, eq), value = eq == arg.npos ? "" : arg.substr(eq + 1);
    bool ok = true;
    if (key == "--target") {
      f->target = value;
    } else if (key == "--threads") {
      ok = absl::SimpleAtoi(value, &f->threads) && f->threads > 0;
    } else if (key == "--mib") {
      ok = absl::SimpleAtoi(value, &f->mib) && f->mib > 0;
    } else if (key == "--seconds") {
      ok = absl::SimpleAtod(value, &f->seconds) && f->seconds > 0;
    } else if (key == "--window") {
      ok = absl::SimpleAtoi(value, &f->window) && f->window >= 0;
    } else if (key == "--chunk_bytes") {
      ok = absl::SimpleAtoi(value, &f->chunk_bytes) && f->chunk_bytes >= 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "mixed_load: bad argument " << arg << "\n";
      return false;
    }
  }
  return true;
}

double Ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, &flags)) return 2;
  ClientOptions options;
  options.target = flags.target;
  options.wait_for_ready = true;
  options.timeout = absl::Seconds(120);
  if (flags.window > 0) options.channel_args["grpc.http2.lookahead_bytes"] = flags.window;
  if (flags.chunk_bytes > 0) options.chunk_bytes = flags.chunk_bytes;
  // One channel for every thread, as one Python client object shared by a thread pool.
  auto client = Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "mixed_load: " << client.status() << "\n";
    return 1;
  }
  const int64_t cols = 1024;
  const int64_t rows = int64_t{flags.mib} * (1 << 20) / 4 / cols;
  std::vector<float> data(rows * cols);
  std::mt19937 rng(1);
  for (float& x : data) x = std::uniform_real_distribution<float>(-1, 1)(rng);

  std::mutex mu;
  std::map<std::string, std::vector<double>> latencies;
  std::map<std::string, int> failures;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < flags.threads; ++t) {
    threads.emplace_back([&, t] {
      const std::string name = absl::StrFormat("mixed_%d", t);
      opserve::v1::ExecuteRequest exec;
      auto* node = exec.add_nodes();
      node->set_id("s");
      node->set_op("row_sum");
      node->add_inputs()->set_stored(name);
      auto* out = exec.add_outputs();
      out->set_node("s");
      out->set_return_inline(true);
      std::map<std::string, std::vector<double>> mine;
      std::map<std::string, int> failed;
      auto timed = [&](const char* rpc, auto call) {
        const auto start = Clock::now();
        const bool ok = call();
        if (ok) {
          mine[rpc].push_back(Ms(start));
        } else {
          ++failed[rpc];
        }
      };
      while (!stop.load()) {
        timed("PutTensor", [&] {
          return (*client)
              ->PutTensor(name, opserve::v1::FLOAT32, {rows, cols}, data.data(), data.size() * 4,
                          /*overwrite=*/true)
              .ok();
        });
        timed("GetTensor", [&] { return (*client)->GetTensor(name).ok(); });
        timed("Execute", [&] { return (*client)->Execute(exec).ok(); });
        timed("DeleteTensor", [&] { return (*client)->DeleteTensor(name).ok(); });
      }
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [rpc, v] : mine) latencies[rpc].insert(latencies[rpc].end(), v.begin(), v.end());
      for (auto& [rpc, n] : failed) failures[rpc] += n;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(flags.seconds));
  stop = true;
  for (std::thread& th : threads) th.join();

  std::cout << absl::StrFormat(
      "%d threads, %d MiB tensors, %.0f s, window %s, chunk %d bytes\n", flags.threads, flags.mib,
      flags.seconds, flags.window > 0 ? std::to_string(flags.window) : "64 MiB (client's)",
      options.chunk_bytes);
  std::cout << absl::StrFormat("%-13s %7s %9s %9s %9s %7s\n", "rpc", "calls", "p50 ms", "p90 ms",
                               "p99 ms", "failed");
  for (const char* rpc : {"PutTensor", "GetTensor", "Execute", "DeleteTensor"}) {
    std::vector<double>& v = latencies[rpc];
    std::sort(v.begin(), v.end());
    auto pct = [&](double p) {
      return v.empty() ? 0.0 : v[std::min(v.size() - 1, size_t(p * v.size()))];
    };
    std::cout << absl::StrFormat("%-13s %7d %9.1f %9.1f %9.1f %7d\n", rpc, v.size(), pct(0.5),
                                 pct(0.9), pct(0.99), failures[rpc]);
  }
  return 0;
}
