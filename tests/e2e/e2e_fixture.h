// The end-to-end fixture: a fresh `opserve --device=$OPSERVE_TEST_DEVICE (cpu)` per test on 127.0.0.1 and a free port,
// a client library connection to it, and helpers to build requests and compare store contents.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/opserve_client.h"
#include "opserve/v1/opserve.grpc.pb.h"
#include "tests/e2e/server_process.h"
#include "tests/support/request_builders.h"

namespace opserve::e2e {

// For tests written for the CPU backend's behaviour (its algorithm names, its slowness): on
// another backend they report themselves skipped, and the GPU suite covers that ground.
#define SKIP_UNLESS_CPU_BACKEND(why)                                                        \
  if (OpserveTest::Device() != "cpu") {                                                     \
    GTEST_SKIP() << "CPU-backend specific (" << why << "); backend is " << OpserveTest::Device(); \
  }

class OpserveTest : public ::testing::Test {
 public:
  // The --device under test: $OPSERVE_TEST_DEVICE, else "cpu" (the GPU suite sets one GPU,
  // "cuda:0", or "cuda:1" for its run on a second GPU).
  static std::string Device();
  static bool IsCuda() { return Device().rfind("cuda", 0) == 0; }
  // What TensorInfo.device reads on that backend: "cpu", or the GPU's name ("cuda:1").
  static std::string ExpectedDevice() {
    return Device() == "cpu" ? "cpu" : Device() == "cuda" ? "cuda:0" : Device();
  }

 protected:
  // Flags added to --host=127.0.0.1 --port=0 --metrics_port=-1 --device=Device() (and
  // --max_compute_capability=$OPSERVE_TEST_MAX_COMPUTE_CAPABILITY where that is set: the GPU
  // suite's capped mode, scripts/gpu-suite.sh --max-cc).
  virtual std::vector<std::string> ExtraFlags() const { return {}; }

  void SetUp() override;
  void TearDown() override;

  // Stops the current server (SIGKILL) and starts another with `extra` flags.
  void Restart(const std::vector<std::string>& extra);

  client::Client& client() { return *client_; }
  ServerProcess& server() { return *server_; }
  // The generated stub, for streams the client library refuses to send (malformed uploads).
  v1::OpServe::Stub& stub() { return *stub_; }

  // Health SERVING over gRPC, and the process still running.
  ::testing::AssertionResult Serving();

  std::mt19937_64 rng_{std::random_device{}()};

 private:
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<v1::OpServe::Stub> stub_;
};

// A sanitizer build of the server reports on its output without always exiting: success when
// `server_output` holds no report. (scripts/ci-sanitizers.sh sends reports to log files instead
// and checks those.)
::testing::AssertionResult NoSanitizerReport(const std::string& server_output);

// ---- statuses and Execute requests ----
// The matcher and the request builders of every suite that drives the server (e2e, hardening,
// soak, GPU), shared with the unit tests.

using test_support::StatusIs;

using test_support::AddInline;
using test_support::AddNode;
using test_support::AddOutput;
using test_support::In;
using test_support::Inline;
using test_support::Node;
using test_support::Stored;

// ---- raw calls ----

struct RawResult {
  grpc::Status status;
  int responses = 0;
};

// One call of opserve.v1.OpServe's `method` over a new plaintext channel to `target` that sends
// `messages` as they are (bytes the generated stub would not produce: invalid UTF-8 in a string
// field, wire data cut short), half-closes, reads every response and finishes. Works for unary
// and streaming methods alike (on the wire a unary call is one message each way). `metadata` is
// added to the call (e.g. {"authorization", "Bearer ..."}).
RawResult RawCall(const std::string& target, const std::string& method,
                  const std::vector<std::string>& messages,
                  const std::multimap<std::string, std::string>& metadata = {});

// ---- a call to cancel ----

// One Execute sent through the generated stub on a thread of its own, so that a test can watch
// it and cancel it while it runs. Destroying it cancels the call if it is still running and
// waits for the thread, so a failed assertion cannot leave the thread behind.
class BackgroundExecute {
 public:
  BackgroundExecute(v1::OpServe::Stub& stub, v1::ExecuteRequest request);
  ~BackgroundExecute();
  BackgroundExecute(const BackgroundExecute&) = delete;
  BackgroundExecute& operator=(const BackgroundExecute&) = delete;

  // Whether the call has ended.
  bool done() const { return done_.load(); }
  void Cancel() { context_.TryCancel(); }
  // Waits for the call to end; its status.
  const grpc::Status& Wait();

 private:
  const v1::ExecuteRequest request_;
  grpc::ClientContext context_;
  v1::ExecuteResponse response_;
  grpc::Status status_;
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: it starts once the members it uses exist
};

// ---- tensors ----

client::HostTensor RandomTensor(v1::DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng);
client::HostTensor F32(std::vector<int64_t> shape, const std::vector<float>& values);
// FLOAT32 values in [-1, 1): RandomTensor draws raw bits (NaNs included), right for round trips
// but not for arithmetic.
client::HostTensor RandomFloats(std::vector<int64_t> shape, std::mt19937_64& rng);
std::vector<float> Floats(const std::string& bytes);

// Every stored tensor's info and bytes, to show that a failed request changed nothing.
struct StoreSnapshot {
  std::map<std::string, std::string> info;   // name -> TensorInfo, serialized
  std::map<std::string, std::string> bytes;  // name -> data
};
StoreSnapshot Snapshot(client::Client& c);
::testing::AssertionResult SameStore(const StoreSnapshot& before, const StoreSnapshot& after);

// ---- exact matmuls, to keep the CPU backend busy with a checkable result ----

// Stores `a` = FLOAT32[n, n] of ones and `b` = FLOAT32[n, n] of random integers in [-8, 8]
// (overwriting), so matmul(a, b) is exact: every row of it is the column sums of b, returned.
absl::StatusOr<std::vector<float>> StoreExactMatmulInputs(client::Client& c, const std::string& a,
                                                          const std::string& b, int64_t n,
                                                          std::mt19937_64& rng);
// One output, FLOAT32[n, n], every row equal to `col_sums`.
::testing::AssertionResult IsExactMatmul(const v1::ExecuteResponse& resp, int64_t n,
                                         const std::vector<float>& col_sums);

}  // namespace opserve::e2e
