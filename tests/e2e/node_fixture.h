// One server process serving several devices (--device=cpu:N in `make test`, every GPU with
// --device=cuda in the GPU suite): the fixture and the helpers its tests share.
//
// Each test is instantiated for N = 2 and N = 3 devices. On the CPU backend the server runs with
// --device=cpu:N. Where $OPSERVE_TEST_DEVICE names a GPU (scripts/gpu-suite.sh), whichever one,
// N = 2 runs --device=cuda (every GPU, so N is the GPU count) and N = 3 runs --device=cuda:0,1,2;
// a machine with fewer GPUs reports the test skipped, never passed. The tests read the devices'
// names and count from ListOps, so one test body serves both backends.
//
// The multi-device calls (PutTensorHeader.device and .shard, MoveTensor, TensorInfo of GetTensor)
// are outside the client library, so NodeClient drives the generated stubs directly; it carries
// a bearer token for the tenant tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/host_tensor.h"
#include "inference/grpc_service.grpc.pb.h"
#include "opserve/v1/opserve.grpc.pb.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {

constexpr uint64_t kMiB = 1 << 20;

struct PutOptions {
  std::string device;  // PutTensorHeader.device: empty lets the server place it
  bool shard = false;
  bool overwrite = false;
};

// A stored tensor read back: GetTensor's info message and the bytes after it.
struct GotTensor {
  v1::TensorInfo info;
  client::HostTensor tensor;
};

// Calls of opserve.v1.OpServe and inference.GRPCInferenceService through the generated stubs,
// each with a 60 s deadline (no call may hang the suite) and, when `token` is set,
// "authorization: Bearer <token>".
class NodeClient {
 public:
  explicit NodeClient(const std::string& target, std::string token = "");

  absl::StatusOr<v1::TensorInfo> Put(const std::string& name, const client::HostTensor& t,
                                     const PutOptions& options = {});
  absl::StatusOr<GotTensor> Get(const std::string& name);
  absl::StatusOr<std::vector<v1::TensorInfo>> List();
  // The one listed under `name`; NOT_FOUND when ListTensors lacks it.
  absl::StatusOr<v1::TensorInfo> Listed(const std::string& name);
  absl::StatusOr<v1::MoveTensorResponse> Move(const std::string& name, const std::string& device);
  absl::StatusOr<v1::TensorInfo> Delete(const std::string& name);
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request);
  absl::StatusOr<v1::ListOpsResponse> ListOps();
  absl::StatusOr<inference::ServerMetadataResponse> ServerMetadata();

 private:
  void Prepare(grpc::ClientContext& ctx) const;

  std::string token_;
  std::unique_ptr<v1::OpServe::Stub> stub_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> inference_;
};

// The fixture; GetParam() is the number of devices asked for.
class NodeTest : public OpserveTest, public ::testing::WithParamInterface<int> {
 protected:
  // Flags after --device, for a test's own server (a budget, a fault to inject, tokens).
  virtual std::vector<std::string> NodeFlags() const { return {}; }
  // The bearer token node() sends, for a server started with --auth_tokens_file.
  virtual std::string Token() const { return ""; }

  void SetUp() override;
  void TearDown() override;

  // The devices the server serves, as ListOps names them, in its order.
  int n() const { return static_cast<int>(names_.size()); }
  const std::string& dev(int i) const { return names_.at(i); }
  const std::vector<std::string>& devices() const { return names_; }
  // A device name of this backend the server does not serve ("cpu:7" with two devices).
  std::string Unserved() const;
  // "cpu:0,cpu:1": names joined as TensorInfo.device and ExecuteResponse.device join them.
  static std::string Joined(const std::vector<std::string>& names);

  NodeClient& node() { return *node_; }
  // Another connection to the server, as the tenant holding `token`.
  std::unique_ptr<NodeClient> Connect(const std::string& token);

  // TensorInfo.device of `name` as ListTensors lists it; "" (and a failure) when not listed.
  std::string DeviceOf(const std::string& name);
  // ListOps's entry for `device`; a failure of the calling test when there is none.
  v1::DeviceInfo DeviceEntry(const std::string& device);

  // Every test draws its data from this generator. The seed is printed when a test fails, and
  // $OPSERVE_TEST_SEED sets it, to replay a failure.
  std::mt19937_64 rng_;
  uint64_t seed_ = 0;

 private:
  std::unique_ptr<NodeClient> node_;
  std::vector<std::string> names_;
};

// Instantiates a NodeTest subclass for two and three devices ("N2", "N3").
#define INSTANTIATE_NODE_TEST(suite)           \
  INSTANTIATE_TEST_SUITE_P(                    \
      Devices, suite, ::testing::Values(2, 3), \
      [](const ::testing::TestParamInfo<int>& p) { return "N" + std::to_string(p.param); })

// ---- sharding: where the contract says each part of a sharded tensor lives ----

struct ShardSpan {
  int device;  // index into the server's devices
  int64_t row_begin;
  int64_t rows;
};
// Rows split over n devices: rows / n each, the first rows % n one more, no empty part.
std::vector<ShardSpan> ExpectedShards(int64_t rows, int n);

// TensorInfo.shards against ExpectedShards(rows, n()) for a tensor of `row_bytes` a row, and
// TensorInfo.device the shards' devices joined.
::testing::AssertionResult ShardedAs(const v1::TensorInfo& info, int64_t rows, uint64_t row_bytes,
                                     const std::vector<std::string>& devices);

// ---- data and the reference ----

// Values fit for arithmetic: FLOAT32 and BFLOAT16 in [-1, 1) (BFLOAT16 rounded from them),
// integers in [-1000, 1000].
client::HostTensor RandomValues(v1::DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng);
uint64_t Bytes(const client::HostTensor& t);

// `op` of the op table's CPU reference row, run in this process on `inputs`.
absl::StatusOr<client::HostTensor> Reference(const std::string& op,
                                             const std::vector<client::HostTensor>& inputs);
// `got` (an output the server returned or stored) against the CPU reference on `inputs`: the
// same dtype and shape, and values within the op's tolerance for `algorithm` on the inputs'
// dtype (the op table's test model: exact for integers, max and min, and transposes).
::testing::AssertionResult MatchesReference(const std::string& op,
                                            const std::vector<client::HostTensor>& inputs,
                                            const client::HostTensor& got,
                                            const std::string& algorithm);
::testing::AssertionResult MatchesReference(const std::string& op,
                                            const std::vector<client::HostTensor>& inputs,
                                            const v1::Tensor& got, const std::string& algorithm);

// The one returned output of `resp` for node `id`; a failure of the calling test if missing.
v1::Tensor Output(const v1::ExecuteResponse& resp, const std::string& id);
// The NodeResult of node `id`; an empty one if missing.
v1::NodeResult NodeReport(const v1::ExecuteResponse& resp, const std::string& id);

// A one-node request: `op` over `inputs`, returned inline, and stored as `store_as` if given.
v1::ExecuteRequest OneNode(const std::string& op, const std::vector<In>& inputs,
                           const std::string& store_as = "");

}  // namespace opserve::e2e
