// Support for the hardening suite: a fixture that starts the real `opserve` binary (CPU backend,
// 127.0.0.1, free gRPC and metrics ports) with per-test flags, reads its Prometheus /metrics,
// generates TLS material with openssl and spawns helper processes. Requests are built with the
// e2e suite's helpers.
//
// Nothing here imitates the server: every check runs against the binary the build produced
// ($OPSERVE_BIN), started through tests/e2e/server_process.h.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/opserve_client.h"
#include "opserve/v1/opserve.grpc.pb.h"
#include "tests/e2e/e2e_fixture.h"
#include "tests/e2e/server_process.h"

namespace opserve::hardening {

using Clock = std::chrono::steady_clock;
inline constexpr uint64_t kMiB = 1 << 20;

double SecondsSince(Clock::time_point t);

// ---- the server under test ----

class HardeningTest : public ::testing::Test {
 protected:
  // Flags added to --host=127.0.0.1 --port=0 --metrics_port=0 --device=cpu.
  virtual std::vector<std::string> ExtraFlags() const { return {}; }
  // The default client's options (target filled in); e.g. a bearer token or TLS files.
  virtual client::ClientOptions DefaultClientOptions() const { return {}; }

  void SetUp() override;
  void TearDown() override;

  e2e::ServerProcess& server() { return *server_; }
  client::Client& client() { return *client_; }
  // A new client of this server; `options.target` is filled in when empty.
  std::unique_ptr<client::Client> NewClient(client::ClientOptions options = {});
  // The generated stub on a plaintext channel: for calls the client library does not offer
  // (a cancelled Execute, a stalled download).
  v1::OpServe::Stub& stub() { return *stub_; }

  // Health SERVING (over the default client's channel) and the process alive.
  ::testing::AssertionResult Serving();

  // The value of the /metrics sample `name{...}` whose labels include every `label="value"`
  // fragment in `labels`; NOT_FOUND when no such sample exists.
  absl::StatusOr<double> Metric(const std::string& name,
                                std::initializer_list<std::string> labels = {});
  // opserve_device_memory_bytes{kind="used"}: the bytes charged to the memory budget.
  uint64_t UsedBytes();
  // Polls UsedBytes() until it equals `bytes` or `timeout` passes; the last value read.
  uint64_t WaitForUsedBytes(uint64_t bytes, std::chrono::milliseconds timeout);
  // opserve_requests_total{rpc=..., code=...}.
  double Requests(const std::string& rpc, const std::string& code);

  std::mt19937_64 rng_{std::random_device{}()};

 private:
  std::unique_ptr<e2e::ServerProcess> server_;
  int metrics_port_ = 0;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<v1::OpServe::Stub> stub_;
};

// ---- statuses, tensors, requests, store snapshots ----
// The e2e suite's helpers (tests/e2e/e2e_fixture.h, the e2e_support library).

using e2e::BackgroundExecute;
using e2e::StatusIs;

using e2e::F32;
using e2e::Floats;
using e2e::RandomTensor;

using e2e::AddInline;
using e2e::AddNode;
using e2e::AddOutput;
using e2e::In;
using e2e::Inline;
using e2e::Node;
using e2e::Stored;

using e2e::SameStore;
using e2e::Snapshot;
using e2e::StoreSnapshot;

// ---- slow work on the CPU backend ----

// Square FLOAT32 matmuls over two stored tensors ("slow_a" all ones, "slow_b" small integers), so
// every result is exact: C[i][j] is the sum of column j of B. Sized at run time, on this machine
// and under its current load, to take about `seconds` each.
class SlowMatmul {
 public:
  static absl::StatusOr<SlowMatmul> Prepare(client::Client& c, double seconds,
                                            std::mt19937_64& rng);
  // One node, its result returned inline.
  v1::ExecuteRequest Request() const;
  // `nodes` independent matmul nodes m0..m{nodes-1}; only the last one's result is returned.
  v1::ExecuteRequest Chain(int nodes) const;
  ::testing::AssertionResult Check(const v1::ExecuteResponse& resp) const;
  int64_t n() const { return n_; }
  double seconds() const { return seconds_; }  // one node, as measured

 private:
  absl::Status Store(client::Client& c, std::mt19937_64& rng);
  int64_t n_ = 0;
  double seconds_ = 0;
  std::vector<float> col_sums_;
};

// ---- TLS material ----

// A temporary directory of PEM files made by the `openssl` command line:
//   ca.pem / ca.key              the test CA
//   server.pem / server.key      signed by it; SAN IP:127.0.0.1 and DNS:localhost
//   client.pem / client.key      signed by it (clientAuth)
//   other_ca.pem                 an unrelated CA
//   other_client.pem / .key      signed by the unrelated CA
// Removed on destruction.
class CertDir {
 public:
  static absl::StatusOr<std::unique_ptr<CertDir>> Create();
  ~CertDir();
  std::string Path(const std::string& file) const { return dir_ + "/" + file; }

 private:
  std::string dir_;
};

// ---- child processes ----

struct CommandResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr together
};
// Runs `argv` to completion (at most `timeout`, then SIGKILL) and collects its output.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A child whose stdout is read line by line: for helpers that say when they reached a point.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::vector<std::string>& argv);
  ~Child();
  // Waits for a line that starts with `prefix`; the whole line.
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix,
                                          std::chrono::milliseconds timeout);
  void Kill();  // SIGKILL and reap
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffered_;
  bool reaped_ = false;
};

// The binaries under test: $OPSERVE_BIN / $OPSERVE_CLI / $HARDENING_UPLOAD_HELPER, else the
// paths this build produced.
std::string OpserveBinary();
std::string CliBinary();
std::string UploadHelperBinary();

}  // namespace opserve::hardening
