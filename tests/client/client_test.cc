// The client library against the real `opserve` binary (CPU backend, started per test through
// tests/e2e/server_process.h): chunked transfers and their progress, status mapping, bearer
// tokens, deadlines, idle timeouts and health; placement, shards and moves on two CPU devices.
//
// Mock nothing that can run here. The in-process fake (fake_opserve.h) remains only for what the
// real server cannot be made to do:
//  - require the x-opserve-session metadata: the real server ignores it; only the proxy in front
//    of the replicas reads it (docs/DEPLOY.md), and no such proxy runs in this test;
//  - store a zero-element tensor: the real server refuses dimensions < 1, so the client's
//    handling of an announced size of 0 (an info and no chunks) can only be reached through
//    the fake; the real server's refusal is tested here too;
//  - send a malformed GetTensor stream (a chunk before the info, more or fewer bytes than
//    announced, an inconsistent or a second info, an absurd size): the client must turn each
//    into an error, and no correct server sends one.
// A server that hangs (accepts, completes HTTP/2's handshake, never answers) is a raw socket
// here (MuteServer): the real server cannot be made to hang.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/opserve_client.h"
#include "fake_opserve.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "tests/e2e/server_process.h"

namespace opserve::client {
namespace {

using ::testing::HasSubstr;

HostTensor Pattern(v1::DType dtype, std::vector<int64_t> shape) {
  HostTensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.data.resize(*ByteSize(dtype, tensor.shape));
  for (size_t i = 0; i < tensor.data.size(); ++i) tensor.data[i] = static_cast<char>(i * 131 + 7);
  return tensor;
}

HostTensor Floats(std::vector<int64_t> shape, const std::vector<float>& values) {
  HostTensor tensor;
  tensor.dtype = v1::FLOAT32;
  tensor.shape = std::move(shape);
  tensor.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return tensor;
}

// Finite float32 bytes of `shape`: Pattern's bytes with every float's top byte set so that its
// exponent is small.
std::string FiniteFloats(std::vector<int64_t> shape) {
  std::string bytes = Pattern(v1::FLOAT32, std::move(shape)).data;
  for (size_t k = 0; k + 4 <= bytes.size(); k += 4) bytes[k + 3] = static_cast<char>(0x3f);
  return bytes;
}

// A ModelInfer request for `model` with FP32 inputs of the given names and 2-D shapes, no bytes.
using InputShapes = std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>>;
inference::ModelInferRequest InferRequest(const std::string& model, const InputShapes& inputs) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  for (const auto& [name, shape] : inputs) {
    auto* in = request.add_inputs();
    in->set_name(name);
    in->set_datatype("FP32");
    in->add_shape(shape.first);
    in->add_shape(shape.second);
  }
  return request;
}

// A real server per test, on the CPU backend, 127.0.0.1 and a free port.
class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(std::vector<std::string> flags, ClientOptions options = {},
             const std::string& device = "cpu") {
    client_.reset();
    server_.reset();
    std::vector<std::string> all = {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1",
                                    "--device=" + device};
    all.insert(all.end(), flags.begin(), flags.end());
    auto server = e2e::ServerProcess::Start(e2e::OpserveBinary(), all);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = Connect(options);
    ASSERT_NE(client_, nullptr);
  }

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    options.target = server_->target();
    if (options.timeout == absl::InfiniteDuration()) options.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  void TearDown() override {
    if (HasFailure() && server_) std::cerr << "---- opserve output ----\n" << server_->Output();
    client_.reset();
    server_.reset();
  }

  void ExpectRoundTrip(const HostTensor& tensor) {
    absl::StatusOr<v1::TensorInfo> info = client_->PutTensor("t", tensor, /*overwrite=*/true);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->bytes(), tensor.data.size());
    absl::StatusOr<HostTensor> back = client_->GetTensor("t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype, tensor.dtype);
    EXPECT_EQ(back->shape, tensor.shape);
    EXPECT_TRUE(back->data == tensor.data);
  }

  std::unique_ptr<e2e::ServerProcess> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, HealthServing) {
  absl::StatusOr<bool> serving = client_->HealthServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

TEST_F(ClientTest, RoundTripsEdgeShapes) {
  ExpectRoundTrip(Pattern(v1::FLOAT32, {}));  // a scalar
  ExpectRoundTrip(Pattern(v1::INT32, {1}));
  ExpectRoundTrip(Pattern(v1::INT64, {3, 1, 5}));
  ExpectRoundTrip(Pattern(v1::FLOAT32, {17, 3}));
  ExpectRoundTrip(Pattern(v1::BFLOAT16, {7}));
  ExpectRoundTrip(Pattern(v1::INT32, {(1 << 18) + 3}));  // one past a chunk, not a multiple of it
  // Zero-element shapes (numpy's empty arrays) are tensors like any other.
  ExpectRoundTrip(Pattern(v1::INT32, {0}));
  ExpectRoundTrip(Pattern(v1::FLOAT32, {3, 0}));
  ExpectRoundTrip(Pattern(v1::BFLOAT16, {3, 0, 5}));
}

// The real server cannot hold a zero-element tensor: this round trip needs the fake.
TEST(ClientAgainstFake, RoundTripsZeroElementTensors) {
  auto server = testing::FakeServer::Start({});
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.target = server->target();
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0}, std::vector<int64_t>{3, 0, 5}}) {
    const HostTensor tensor = Pattern(v1::INT64, shape);
    ASSERT_TRUE((*client)->PutTensor("z", tensor, true).ok());
    absl::StatusOr<HostTensor> back = (*client)->GetTensor("z");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape, shape);
    EXPECT_TRUE(back->data.empty());
  }
}

// Chunks that do not divide the tensor, tiny chunks, and one chunk exactly the size.
TEST_F(ClientTest, RoundTripsWithAnyChunkSize) {
  for (int64_t chunk : {1, 7, 1000, 4096, 1 << 20}) {
    ClientOptions options;
    options.chunk_bytes = chunk;
    std::unique_ptr<Client> client = Connect(options);
    ASSERT_NE(client, nullptr);
    const HostTensor tensor = Pattern(v1::FLOAT32, {chunk == 1 ? 33 : 4096, 3});
    ASSERT_TRUE(client->PutTensor("t", tensor, /*overwrite=*/true).ok()) << chunk;
    absl::StatusOr<HostTensor> back = client->GetTensor("t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->data == tensor.data) << "chunk " << chunk;
  }
}

TEST_F(ClientTest, RoundTripsTensorsLargerThanTheMessageLimit) {
  Start({"--max_message_bytes=4194304"});  // gRPC's default limit
  ExpectRoundTrip(Pattern(v1::INT64, {5 << 20}));  // 40 MiB: ten times the server's limit
}

TEST_F(ClientTest, ChecksTheByteCountBeforeSending) {
  const HostTensor tensor = Pattern(v1::FLOAT32, {2, 3});
  absl::StatusOr<v1::TensorInfo> info =
      client_->PutTensor("t", v1::FLOAT32, {2, 3}, tensor.data.data(), 20, false);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("needs 24 bytes, given 20"));
  info = client_->PutTensor("t", v1::DTYPE_UNSPECIFIED, {2}, tensor.data.data(), 8, false);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  info = client_->PutTensor("", tensor, false);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  // None of them reached the server.
  absl::StatusOr<std::vector<v1::TensorInfo>> listed = client_->ListTensors();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

// The client's status is the server's: the same code and message the generated stub receives
// for the same call. The put is refused at its header, while its 4 MiB of chunks are still
// being sent.
TEST_F(ClientTest, KeepsTheServersCodeAndMessage) {
  auto stub = v1::OpServe::NewStub(
      grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
  const HostTensor tensor = Pattern(v1::FLOAT32, {1 << 20});
  ASSERT_TRUE(client_->PutTensor("t", tensor, false).ok());
  absl::StatusOr<v1::TensorInfo> again = client_->PutTensor("t", tensor, false);
  grpc::Status raw_again;
  {
    grpc::ClientContext ctx;
    v1::PutTensorResponse resp;
    auto writer = stub->PutTensor(&ctx, &resp);
    v1::PutTensorRequest header;
    header.mutable_header()->set_name("t");
    header.mutable_header()->set_dtype(v1::FLOAT32);
    header.mutable_header()->add_shape(1 << 20);
    writer->Write(header);
    writer->WritesDone();
    raw_again = writer->Finish();
  }
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(static_cast<int>(again.status().code()), static_cast<int>(raw_again.error_code()));
  EXPECT_EQ(again.status().message(), raw_again.error_message());

  absl::StatusOr<HostTensor> missing = client_->GetTensor("nope");
  grpc::Status raw_missing;
  {
    grpc::ClientContext ctx;
    v1::GetTensorRequest req;
    req.set_name("nope");
    auto reader = stub->GetTensor(&ctx, req);
    v1::GetTensorResponse msg;
    while (reader->Read(&msg)) {
    }
    raw_missing = reader->Finish();
  }
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), raw_missing.error_message());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'nope'"));
  EXPECT_EQ(client_->DeleteTensor("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, ListsAndDeletes) {
  ASSERT_TRUE(client_->PutTensor("a", Pattern(v1::INT32, {4}), false).ok());
  ASSERT_TRUE(client_->PutTensor("b", Pattern(v1::INT64, {2, 2}), false).ok());
  absl::StatusOr<std::vector<v1::TensorInfo>> listed = client_->ListTensors();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[1].name(), "b");
  EXPECT_EQ((*listed)[1].bytes(), 32u);
  absl::StatusOr<v1::TensorInfo> deleted = client_->DeleteTensor("a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(deleted->name(), "a");
  EXPECT_EQ(client_->ListTensors()->size(), 1u);
}

TEST_F(ClientTest, ExecuteAndListOps) {
  absl::StatusOr<v1::ListOpsResponse> ops = client_->ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->backend(), "cpu");
  const v1::OpInfo* sum = nullptr;
  for (const v1::OpInfo& op : ops->ops()) {
    if (op.name() == "sum") sum = &op;
  }
  ASSERT_NE(sum, nullptr);

  v1::ExecuteRequest request;
  v1::Node* node = request.add_nodes();
  node->set_id("n");
  node->set_op("sum");
  node->add_inputs()->set_inline_name("x");
  (*request.mutable_inline_tensors())["x"] = ToProto(Floats({3}, {1.5f, 2.f, -0.25f}));
  v1::OutputSpec* out = request.add_outputs();
  out->set_node("n");
  out->set_return_inline(true);
  absl::StatusOr<v1::ExecuteResponse> response = client_->Execute(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->nodes_size(), 1);
  EXPECT_EQ(response->nodes(0).id(), "n");
  EXPECT_EQ(response->nodes(0).algorithm(), sum->default_algorithm());
  ASSERT_EQ(response->outputs_size(), 1);
  absl::StatusOr<HostTensor> result = FromProto(response->outputs(0).tensor());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->shape, std::vector<int64_t>{});
  float value = 0;
  std::memcpy(&value, result->data.data(), sizeof value);
  EXPECT_EQ(value, 3.25f);
}

// ModelInfer with raw inputs sent from the caller's memory: the same response, bit for bit, as
// the generated stub's copy of the same request, for one input and for two.
TEST_F(ClientTest, ModelInferSendsRawInputsAsTheGeneratedStubWould) {
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
  // row_mean of 700x1500 (4.2 MB, several HTTP/2 frames and read slices), matmul of 40x30 by 30x20.
  std::vector<std::string> x = {FiniteFloats({700, 1500})};
  std::vector<std::string> ab = {FiniteFloats({40, 30}), FiniteFloats({30, 20})};
  inference::ModelInferRequest mean = InferRequest("row_mean", {{"x", {700, 1500}}});
  inference::ModelInferRequest mm = InferRequest("matmul", {{"a", {40, 30}}, {"b", {30, 20}}});
  for (auto [request, raw] : {std::pair{&mean, &x}, std::pair{&mm, &ab}}) {
    std::vector<absl::string_view> views(raw->begin(), raw->end());
    absl::StatusOr<inference::ModelInferResponse> ours = client_->ModelInfer(*request, views);
    ASSERT_TRUE(ours.ok()) << request->model_name() << ": " << ours.status();
    inference::ModelInferRequest copied = *request;
    for (const std::string& bytes : *raw) copied.add_raw_input_contents(bytes);
    grpc::ClientContext ctx;
    inference::ModelInferResponse theirs;
    grpc::Status s = stub->ModelInfer(&ctx, copied, &theirs);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(ours->raw_output_contents_size(), 1) << request->model_name();
    EXPECT_FALSE(ours->raw_output_contents(0).empty());
    EXPECT_TRUE(ours->raw_output_contents(0) == theirs.raw_output_contents(0))
        << request->model_name();
    EXPECT_EQ(ours->outputs(0).shape(0), theirs.outputs(0).shape(0));
  }
}

// --retain_freed_host_memory changes only where the receive buffers come from: a 32 MiB input,
// sent three times (the second and third reuse what the first left), gives the same bits either
// way.
TEST_F(ClientTest, LargeInputsGiveTheSameResultWithEitherMallocSetting) {
  const std::string bytes = FiniteFloats({2048, 4096});
  const absl::string_view view(bytes);
  const inference::ModelInferRequest request = InferRequest("row_mean", {{"x", {2048, 4096}}});
  std::vector<std::string> results;
  for (const char* flag : {"--retain_freed_host_memory=true", "--retain_freed_host_memory=false"}) {
    SCOPED_TRACE(flag);
    Start({flag});
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<inference::ModelInferResponse> r = client_->ModelInfer(request, {&view, 1});
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->raw_output_contents_size(), 1);
      results.push_back(r->raw_output_contents(0));
    }
  }
  ASSERT_EQ(results.size(), 6u);
  EXPECT_EQ(results[0].size(), 2048u * 4);
  for (const std::string& r : results) EXPECT_TRUE(r == results[0]);
}

// A server that refuses a request before reading all of it (here: past its message limit) ends the
// call while part of the borrowed bytes is still queued. The caller frees them as soon as
// ModelInfer returns: CI's ASan run of this suite reports any later read. (gRPC 1.51 drops such
// queued frames before the call completes; ModelInfer's own wait is for versions that do not.)
TEST_F(ClientTest, ModelInferReturnsOnlyOnceTheServerIsDoneWithTheBytes) {
  Start({"--max_message_bytes=1048576"});
  inference::ModelInferRequest request = InferRequest("row_mean", {{"x", {1024, 4096}}});
  for (int round = 0; round < 3; ++round) {
    auto bytes = std::make_unique<char[]>(16 << 20);
    std::memset(bytes.get(), 0x3f, 16 << 20);
    const absl::string_view view(bytes.get(), 16 << 20);
    absl::StatusOr<inference::ModelInferResponse> r = client_->ModelInfer(request, {&view, 1});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    bytes.reset();
  }
  // An unknown model, answered after the whole request arrived.
  request.set_model_name("no_such_model");
  const std::string small(16, '\0');
  const absl::string_view view(small);
  EXPECT_EQ(client_->ModelInfer(request, {&view, 1}).status().code(), absl::StatusCode::kNotFound);
  // Bytes in the request and beside it: refused before anything is sent.
  request.add_raw_input_contents(small);
  EXPECT_EQ(client_->ModelInfer(request, {&view, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client_->HealthServing().ok());
}

// A per-call timeout shorter than the work: two 768^3 matmuls on the CPU backend take far more
// than 50 ms. The client's default (none here) is untouched by it.
// A server of two CPU devices (--device=cpu:2): placement, sharding and moves.
class MultiDeviceClientTest : public ClientTest {
 protected:
  void SetUp() override { Start({}, {}, "cpu:2"); }
};

TEST_F(MultiDeviceClientTest, PutsWhereAskedAndMoves) {
  const HostTensor tensor = Pattern(v1::INT32, {4, 8});
  absl::StatusOr<v1::TensorInfo> info =
      client_->PutTensor("a", tensor, false, Placement{.device = "cpu:1"});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->device(), "cpu:1");
  EXPECT_EQ(info->shards_size(), 0);
  info = client_->PutTensorShm("b", tensor, false, Placement{.device = "cpu:0"});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->device(), "cpu:0");

  absl::StatusOr<v1::MoveTensorResponse> moved = client_->MoveTensor("a", "cpu:0");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->info().device(), "cpu:0");
  EXPECT_EQ(moved->bytes(), tensor.data.size());
  EXPECT_GE(moved->seconds(), 0);
  moved = client_->MoveTensor("a", "cpu:0");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->bytes(), 0u);  // there already
  absl::StatusOr<std::vector<v1::TensorInfo>> listed = client_->ListTensors();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].device(), "cpu:0");
  absl::StatusOr<HostTensor> back = client_->GetTensor("a");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == tensor.data);
}

TEST_F(MultiDeviceClientTest, ShardsByRows) {
  // 5 rows over 2 devices: 3 on the first, 2 on the second.
  const HostTensor tensor = Pattern(v1::FLOAT32, {5, 3});
  absl::StatusOr<v1::TensorInfo> info =
      client_->PutTensor("s", tensor, false, Placement{.shard = true});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->device(), "cpu:0,cpu:1");
  ASSERT_EQ(info->shards_size(), 2);
  EXPECT_EQ(info->shards(0).device(), "cpu:0");
  EXPECT_EQ(info->shards(0).row_begin(), 0);
  EXPECT_EQ(info->shards(0).rows(), 3);
  EXPECT_EQ(info->shards(0).bytes(), 36u);
  EXPECT_EQ(info->shards(1).device(), "cpu:1");
  EXPECT_EQ(info->shards(1).row_begin(), 3);
  EXPECT_EQ(info->shards(1).rows(), 2);
  absl::StatusOr<HostTensor> back = client_->GetTensor("s");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == tensor.data);

  absl::StatusOr<v1::MoveTensorResponse> gathered = client_->MoveTensor("s", "cpu:1");
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_EQ(gathered->info().device(), "cpu:1");
  EXPECT_EQ(gathered->info().shards_size(), 0);
  back = client_->GetTensor("s");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == tensor.data);
}

TEST_F(MultiDeviceClientTest, PlacementMistakesKeepTheServersCode) {
  absl::Status status =
      client_->PutTensor("x", Pattern(v1::FLOAT32, {2, 2}), false, Placement{.device = "cpu:7"})
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("cpu:7"));
  status = client_->PutTensor("v", Pattern(v1::FLOAT32, {4}), false, Placement{.shard = true})
               .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  status = client_->MoveTensor("nope", "cpu:0").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("nope"));
  ASSERT_TRUE(client_->PutTensor("y", Pattern(v1::FLOAT32, {2}), false).ok());
  status = client_->MoveTensor("y", "cpu:9").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("cpu:9"));
}

TEST_F(ClientTest, PerCallDeadline) {
  ASSERT_TRUE(client_->PutTensor("a", Pattern(v1::BFLOAT16, {768, 768}), false).ok());
  v1::ExecuteRequest request;
  for (const char* id : {"m1", "m2"}) {
    v1::Node* node = request.add_nodes();
    node->set_id(id);
    node->set_op("matmul");
    node->add_inputs()->set_stored("a");
    node->add_inputs()->set_stored("a");
  }
  absl::StatusOr<v1::ExecuteResponse> response =
      client_->Execute(request, {.timeout = absl::Milliseconds(50)});
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(client_->ListTensors().ok());
}

TEST_F(ClientTest, SendsTheBearerToken) {
  const std::string tokens = ::testing::TempDir() + "/client_test_tokens.txt";
  std::ofstream(tokens) << "tenant:s3cret\n";
  Start({"--auth_tokens_file=" + tokens});
  std::remove(tokens.c_str());  // read once, at start-up
  EXPECT_EQ(client_->ListTensors().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(client_->PutTensor("t", Pattern(v1::INT32, {1}), false).status().code(),
            absl::StatusCode::kUnauthenticated);
  ClientOptions options;
  options.bearer_token = "wrong";
  EXPECT_EQ(Connect(options)->ListTensors().status().code(), absl::StatusCode::kUnauthenticated);
  options.bearer_token = "s3cret";
  std::unique_ptr<Client> client = Connect(options);
  EXPECT_TRUE(client->ListTensors().ok());
  EXPECT_TRUE(client->PutTensor("t", Pattern(v1::INT32, {1}), false).ok());
  EXPECT_TRUE(client->GetTensor("t").ok());
}

// The session header is for a proxy (docs/DEPLOY.md) that this test does not run; the real
// server ignores it, so the fake checks it arrives on every kind of call.
TEST(ClientAgainstFake, SendsTheSession) {
  testing::FakeServerOptions server_options;
  server_options.required_metadata = {{"authorization", "Bearer s3cret"},
                                      {"x-opserve-session", "s1"}};
  auto server = testing::FakeServer::Start(server_options);
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.target = server->target();
  options.bearer_token = "s3cret";
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->ListTensors().status().code(), absl::StatusCode::kUnauthenticated);
  options.session = "s1";
  client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->ListTensors().ok());
  EXPECT_TRUE((*client)->PutTensor("t", Pattern(v1::INT32, {1}), false).ok());
  EXPECT_TRUE((*client)->GetTensor("t").ok());
}

// Session ids are 32 hex digits, fresh at every draw.
TEST(ClientSession, NewSessionIdsAreFreshHex) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewSessionId();
    ASSERT_EQ(id.size(), 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    EXPECT_TRUE(seen.insert(id).second) << "drawn twice: " << id;
  }
}

// A broken or hostile server's malformed download: an error, never a crash, an overrun or a
// tensor with the wrong bytes.
TEST(ClientAgainstFake, MalformedDownloadsAreErrors) {
  using testing::GetStream;
  const struct {
    GetStream stream;
    absl::StatusCode code;
    const char* fragment;
  } cases[] = {
      {GetStream::kChunkBeforeInfo, absl::StatusCode::kDataLoss, "info first"},
      {GetStream::kMoreThanAnnounced, absl::StatusCode::kDataLoss, "more"},
      {GetStream::kFewerThanAnnounced, absl::StatusCode::kDataLoss, "received"},
      {GetStream::kInconsistentInfo, absl::StatusCode::kDataLoss, "inconsistent"},
      {GetStream::kTwoInfos, absl::StatusCode::kDataLoss, "info first"},
      {GetStream::kHugeAnnounced, absl::StatusCode::kResourceExhausted, "cannot allocate"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.stream));
    testing::FakeServerOptions server_options;
    server_options.get_stream = c.stream;
    auto server = testing::FakeServer::Start(server_options);
    ASSERT_NE(server, nullptr);
    ClientOptions options;
    options.target = server->target();
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->PutTensor("t", Pattern(v1::FLOAT32, {1000}), false).ok());
    absl::StatusOr<HostTensor> got = (*client)->GetTensor("t");
    EXPECT_EQ(got.status().code(), c.code) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.fragment));
  }
}

TEST_F(ClientTest, ReportsTransferProgressPerChunk) {
  const HostTensor tensor = Pattern(v1::FLOAT32, {5, 1000, 1000});  // 20 MB: 5 chunks of 4 MiB
  const uint64_t total = tensor.data.size();
  for (const bool put : {true, false}) {
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    CallOptions call;
    call.progress = [&calls](uint64_t done, uint64_t of) { calls.emplace_back(done, of); };
    if (put) {
      ASSERT_TRUE(client_->PutTensor("p", tensor, /*overwrite=*/true, call).ok());
    } else {
      ASSERT_TRUE(client_->GetTensor("p", call).ok());
    }
    const uint64_t chunks = (total + kDefaultChunkBytes - 1) / kDefaultChunkBytes;
    ASSERT_GE(calls.size(), chunks + 1) << (put ? "put" : "get");
    EXPECT_EQ(calls.front(), std::make_pair(uint64_t{0}, total));
    EXPECT_EQ(calls.back(), std::make_pair(total, total));
    for (size_t i = 1; i < calls.size(); ++i) {
      EXPECT_GT(calls[i].first, calls[i - 1].first) << "call " << i;
      EXPECT_EQ(calls[i].second, total);
    }
  }
}

// A listener that speaks just enough HTTP/2 for gRPC to consider the channel ready (its SETTINGS
// and the ack of the client's) and then never answers: a server that hangs.
class MuteServer {
 public:
  MuteServer() {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listener_, 8) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ADD_FAILURE() << "MuteServer: " << std::strerror(errno);
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~MuteServer() {
    stop_ = true;
    thread_.join();
    for (int fd : connections_) close(fd);
    close(listener_);
  }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  void Serve() {
    static constexpr unsigned char kSettingsAndAck[] = {0, 0, 0, 4, 0, 0, 0, 0, 0,
                                                        0, 0, 0, 4, 1, 0, 0, 0, 0};
    while (!stop_) {
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      for (int fd : connections_) fds.push_back({fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int fd = accept(listener_, nullptr, nullptr);
        if (fd < 0) continue;
        (void)!write(fd, kSettingsAndAck, sizeof(kSettingsAndAck));
        connections_.push_back(fd);
      }
      char sink[65536];
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & POLLIN) (void)!read(fds[i].fd, sink, sizeof(sink));
      }
    }
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> connections_;  // touched by Serve alone until the destructor's join
  std::thread thread_;
};

TEST(ClientConnect, IdleTimeoutEndsTransfersToAServerThatNeverAnswers) {
  MuteServer mute;
  ClientOptions options;
  options.target = mute.target();
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  const CallOptions call = {.idle_timeout = absl::Milliseconds(500)};
  for (const bool put : {true, false}) {
    const absl::Time start = absl::Now();
    const absl::Status status =
        put ? (*client)->PutTensor("t", Pattern(v1::INT32, {1 << 20}), false, call).status()
            : (*client)->GetTensor("t", call).status();
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat(put ? "PutTensor" : "GetTensor", " 't': nothing moved")));
    EXPECT_LT(took, absl::Seconds(5)) << (put ? "put" : "get");
  }
  // A plain deadline ends a unary call to it the same way.
  EXPECT_EQ((*client)->ListTensors({.timeout = absl::Milliseconds(500)}).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(ClientConnect, RejectsBadOptions) {
  ClientOptions options;
  options.chunk_bytes = 0;
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.target = "";
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.root_ca_path = "/nonexistent/ca.pem";
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kNotFound);
}

TEST(ClientConnect, UnreachableServerIsUnavailable) {
  ClientOptions options;
  options.target = "127.0.0.1:1";  // nothing listens on port 1
  options.timeout = absl::Seconds(5);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->HealthServing().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*client)->PutTensor("t", Pattern(v1::INT32, {4}), false).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ((*client)->GetTensor("t").status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace opserve::client
