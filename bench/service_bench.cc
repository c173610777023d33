// The service path over loopback gRPC: the real `opserve` binary (--device=cuda --port=0), the
// client library, and a blocking unary grpc.health.v1.Health/Check as gRPC's own floor.
//
//   - Execute of one row_mean node (algorithm auto) on a stored 4096x4096 FLOAT32 tensor, the
//     16 KiB result returned inline: end-to-end p50/p99 against the node's kernel_us.
//   - Health/Check to the same server in the same loop (interleaved call by call, so both see the
//     same machine state): through a blocking unary call on its own channel (the floor the target
//     uses) and through the client library's HealthServing.
//   - PutTensor and GetTensor of a 1 GiB tensor: bytes over the call's wall time.
#include "bench/service_bench.h"
#include "bench/service_process.h"

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
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/opserve_client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

extern char** environ;

namespace opserve::bench {
namespace {

constexpr int64_t kRows = 4096, kCols = 4096;
constexpr uint64_t kTransferBytes = 1ull << 30;

}  // namespace

ServiceFigures RunServiceBench(const ServiceOptions& opt) {
  ServiceFigures f;
  Session session;
  if (std::string err = session.Open(opt.opserve_bin, opt.server_args, opt.chunk_bytes);
      !err.empty()) {
    f.error = err;
    return f;
  }
  client::Client& c = *session.client;
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
  const v1::ExecuteRequest req = RowMeanOfStored("bench_x");

  std::vector<double> exec_us, kernel_us, health_us, raw_health_us;
  std::vector<double> s_total, s_queue, s_input, s_compute, s_output;
  for (int i = 0; i < opt.warmups + opt.executes; ++i) {
    const auto t0 = Clock::now();
    auto resp = c.Execute(req);
    const auto t1 = Clock::now();
    const bool raw_ok = HealthCheck(session.raw_channel.get());
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
