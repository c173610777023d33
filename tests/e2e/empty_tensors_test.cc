// Empty tensors (a zero-length dimension, as numpy sends for an empty array) through every
// tensor RPC of the real server, for every dtype: a PutTensor of a header and no chunk stores
// them, ListTensors and DeleteTensor report them with 0 bytes, and GetTensor answers with the
// info message alone. Put and Get go through the generated stub, so that the test sees exactly
// which messages cross the wire; the client library's round trip is checked on top.
#include <grpcpp/client_context.h>

#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

const std::vector<v1::DType> kDTypes = {v1::FLOAT32, v1::INT32, v1::INT64, v1::BFLOAT16};
const std::vector<std::vector<int64_t>> kEmptyShapes = {{0}, {3, 0}, {0, 5}};

std::vector<int64_t> ShapeOf(const v1::TensorInfo& info) {
  return {info.shape().begin(), info.shape().end()};
}

std::string NameOf(v1::DType dtype, const std::vector<int64_t>& shape) {
  return absl::StrCat(v1::DType_Name(dtype), "_", absl::StrJoin(shape, "x"));
}

class EmptyTensorsTest : public OpserveTest {
 protected:
  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  // One PutTensor stream holding the header alone.
  absl::StatusOr<v1::TensorInfo> PutHeaderOnly(const std::string& name, v1::DType dtype,
                                               const std::vector<int64_t>& shape) {
    auto ctx = Context();
    v1::PutTensorResponse resp;
    auto w = stub().PutTensor(ctx.get(), &resp);
    v1::PutTensorRequest header;
    header.mutable_header()->set_name(name);
    header.mutable_header()->set_dtype(dtype);
    header.mutable_header()->mutable_shape()->Add(shape.begin(), shape.end());
    w->Write(header);
    w->WritesDone();
    absl::Status s = client::ToAbslStatus(w->Finish());
    if (!s.ok()) return s;
    return resp.info();
  }

  // Every message of one GetTensor stream, and its status.
  absl::Status GetAll(const std::string& name, std::vector<v1::GetTensorResponse>* messages) {
    auto ctx = Context();
    v1::GetTensorRequest req;
    req.set_name(name);
    auto r = stub().GetTensor(ctx.get(), req);
    v1::GetTensorResponse m;
    while (r->Read(&m)) messages->push_back(m);
    return client::ToAbslStatus(r->Finish());
  }
};

TEST_F(EmptyTensorsTest, PutListGetDeleteEveryDtype) {
  std::map<std::string, std::pair<v1::DType, std::vector<int64_t>>> stored;
  for (v1::DType dtype : kDTypes) {
    for (const std::vector<int64_t>& shape : kEmptyShapes) {
      const std::string name = NameOf(dtype, shape);
      SCOPED_TRACE(name);
      absl::StatusOr<v1::TensorInfo> info = PutHeaderOnly(name, dtype, shape);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->name(), name);
      EXPECT_EQ(info->dtype(), dtype);
      EXPECT_EQ(ShapeOf(*info), shape);
      EXPECT_EQ(info->bytes(), 0u);
      EXPECT_EQ(info->device(), ExpectedDevice());
      stored[name] = {dtype, shape};
    }
  }

  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), stored.size());
  for (const v1::TensorInfo& info : *list) {
    SCOPED_TRACE(info.name());
    ASSERT_EQ(stored.count(info.name()), 1u);
    EXPECT_EQ(info.dtype(), stored[info.name()].first);
    EXPECT_EQ(ShapeOf(info), stored[info.name()].second);
    EXPECT_EQ(info.bytes(), 0u);
  }

  for (const auto& [name, meta] : stored) {
    SCOPED_TRACE(name);
    // On the wire: the info message and no chunk message at all.
    std::vector<v1::GetTensorResponse> messages;
    absl::Status s = GetAll(name, &messages);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(messages.size(), 1u) << "expected the info message alone";
    ASSERT_TRUE(messages[0].has_info());
    EXPECT_EQ(messages[0].info().name(), name);
    EXPECT_EQ(messages[0].info().dtype(), meta.first);
    EXPECT_EQ(ShapeOf(messages[0].info()), meta.second);
    EXPECT_EQ(messages[0].info().bytes(), 0u);

    // Through the client library: an empty tensor of the same dtype and shape.
    absl::StatusOr<client::HostTensor> got = client().GetTensor(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->dtype, meta.first);
    EXPECT_EQ(got->shape, meta.second);
    EXPECT_TRUE(got->data.empty());
  }

  for (const auto& [name, meta] : stored) {
    SCOPED_TRACE(name);
    absl::StatusOr<v1::TensorInfo> deleted = client().DeleteTensor(name);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_EQ(deleted->name(), name);
    EXPECT_EQ(deleted->dtype(), meta.first);
    EXPECT_EQ(ShapeOf(*deleted), meta.second);
    EXPECT_EQ(deleted->bytes(), 0u);
    EXPECT_TRUE(StatusIs(client().GetTensor(name).status(), absl::StatusCode::kNotFound));
  }
  list = client().ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  EXPECT_TRUE(Serving());
}

// The client library sends an empty tensor as a header alone too, and an overwrite swaps an
// empty tensor and a full one both ways.
TEST_F(EmptyTensorsTest, ClientRoundTripAndOverwrite) {
  for (v1::DType dtype : kDTypes) {
    const client::HostTensor empty = RandomTensor(dtype, {0, 5}, rng_);
    const client::HostTensor full = RandomTensor(dtype, {2, 5}, rng_);
    const std::string name = absl::StrCat("x_", v1::DType_Name(dtype));
    SCOPED_TRACE(name);
    absl::StatusOr<v1::TensorInfo> info = client().PutTensor(name, empty, false);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->bytes(), 0u);
    ASSERT_TRUE(client().PutTensor(name, full, /*overwrite=*/true).ok());
    absl::StatusOr<client::HostTensor> got = client().GetTensor(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->data == full.data);
    ASSERT_TRUE(client().PutTensor(name, empty, /*overwrite=*/true).ok());
    got = client().GetTensor(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->shape, (std::vector<int64_t>{0, 5}));
    EXPECT_TRUE(got->data.empty());
  }
}

// An empty tensor still holds exactly zero bytes: a chunk, even of one byte, is too many.
TEST_F(EmptyTensorsTest, AChunkForAnEmptyTensorIsRefused) {
  auto ctx = Context();
  v1::PutTensorResponse resp;
  auto w = stub().PutTensor(ctx.get(), &resp);
  v1::PutTensorRequest header, chunk;
  header.mutable_header()->set_name("e");
  header.mutable_header()->set_dtype(v1::FLOAT32);
  header.mutable_header()->add_shape(0);
  chunk.set_chunk(std::string(1, '\0'));
  w->Write(header);
  w->Write(chunk);
  w->WritesDone();
  EXPECT_TRUE(StatusIs(client::ToAbslStatus(w->Finish()), absl::StatusCode::kInvalidArgument,
                       {"'e'", "0 bytes"}));
  EXPECT_TRUE(client().ListTensors()->empty());
}

}  // namespace
}  // namespace opserve::e2e
