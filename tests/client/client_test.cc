// The client library against the in-process fake server: chunked transfers, status mapping,
// bearer tokens, deadlines and health.
#include "client/opserve_client.h"
#include "fake_opserve.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(testing::FakeServerOptions server_options, ClientOptions options = {}) {
    server_ = testing::FakeServer::Start(server_options);
    ASSERT_NE(server_, nullptr);
    options.target = server_->target();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
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

  std::unique_ptr<testing::FakeServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, HealthServing) {
  absl::StatusOr<bool> serving = client_->HealthServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

TEST_F(ClientTest, RoundTripsEdgeShapes) {
  ExpectRoundTrip(Pattern(v1::FLOAT32, {}));
  ExpectRoundTrip(Pattern(v1::INT32, {0}));
  ExpectRoundTrip(Pattern(v1::INT64, {3, 0, 5}));
  ExpectRoundTrip(Pattern(v1::FLOAT32, {17, 3}));
}

// Chunks that do not divide the tensor, tiny chunks, and one chunk exactly the size.
TEST(ClientChunking, RoundTripsWithAnyChunkSize) {
  for (int64_t chunk : {1, 7, 1000, 4096, 1 << 20}) {
    auto server = testing::FakeServer::Start({});
    ASSERT_NE(server, nullptr);
    ClientOptions options;
    options.target = server->target();
    options.chunk_bytes = chunk;
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok());
    const HostTensor tensor = Pattern(v1::FLOAT32, {chunk == 1 ? 33 : 4096, 3});
    ASSERT_TRUE((*client)->PutTensor("t", tensor, false).ok()) << chunk;
    absl::StatusOr<HostTensor> back = (*client)->GetTensor("t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->data == tensor.data) << "chunk " << chunk;
  }
}

TEST_F(ClientTest, RoundTripsTensorsLargerThanTheMessageLimit) {
  ExpectRoundTrip(Pattern(v1::INT64, {5 << 20}));  // 40 MiB: ten times gRPC's default limit
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
}

// The fake refuses right after the header, while chunks are still being sent.
TEST_F(ClientTest, KeepsTheServersCodeAndMessage) {
  const HostTensor tensor = Pattern(v1::FLOAT32, {1 << 20});
  ASSERT_TRUE(client_->PutTensor("t", tensor, false).ok());
  absl::StatusOr<v1::TensorInfo> again = client_->PutTensor("t", tensor, false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(again.status().message(), "tensor 't' exists");

  absl::StatusOr<HostTensor> missing = client_->GetTensor("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "no tensor 'nope'");
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
  v1::ExecuteRequest request;
  v1::Node* node = request.add_nodes();
  node->set_id("n");
  node->set_op("sum");
  (*request.mutable_inline_tensors())["x"] = ToProto(Pattern(v1::FLOAT32, {3}));
  absl::StatusOr<v1::ExecuteResponse> response = client_->Execute(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->nodes(0).algorithm(), "fake");
  EXPECT_EQ(response->outputs(0).tensor().data(), request.inline_tensors().at("x").data());
  absl::StatusOr<v1::ListOpsResponse> ops = client_->ListOps();
  ASSERT_TRUE(ops.ok());
  EXPECT_EQ(ops->ops(0).name(), "sum");
}

TEST_F(ClientTest, PerCallDeadline) {
  v1::ExecuteRequest request;
  v1::Node* node = request.add_nodes();
  node->set_op("sleep");
  (*node->mutable_attrs())["ms"].set_i(500);
  absl::StatusOr<v1::ExecuteResponse> response =
      client_->Execute(request, {.timeout = absl::Milliseconds(50)});
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ClientTest, SendsTheBearerTokenAndSession) {
  testing::FakeServerOptions server_options;
  server_options.required_metadata = {{"authorization", "Bearer s3cret"},
                                      {"x-opserve-session", "s1"}};
  Start(server_options);
  EXPECT_EQ(client_->ListTensors().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(client_->PutTensor("t", Pattern(v1::INT32, {1}), false).status().code(),
            absl::StatusCode::kUnauthenticated);
  ClientOptions options;
  options.bearer_token = "s3cret";
  Start(server_options, options);
  EXPECT_EQ(client_->ListTensors().status().code(), absl::StatusCode::kUnauthenticated);
  options.session = "s1";
  Start(server_options, options);
  EXPECT_TRUE(client_->ListTensors().ok());
  EXPECT_TRUE(client_->PutTensor("t", Pattern(v1::INT32, {1}), false).ok());
  EXPECT_TRUE(client_->GetTensor("t").ok());
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
