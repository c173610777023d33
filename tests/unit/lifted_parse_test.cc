// ParseLifting (server/rpc/lifted_parse.h) and the request traits that call it, on requests split
// over many gRPC slices (no gRPC threads or calls: byte buffers only): ModelInfer's top-level
// raw_input_contents and Execute's inline tensor data inside map entries, each against
// protobuf's own parse of the same bytes.
#include "server/rpc/lifted_parse.h"

#include <gtest/gtest.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "tests/support/canonical_proto.h"
#include "inference/grpc_service.pb.h"
#include "opserve/v1/opserve.pb.h"
#include "server/rpc/request_parsing.h"

namespace opserve {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// `wire` as gRPC hands it over: in slices of `slice` bytes, so fields, varints and the lifted
// entries themselves straddle slice boundaries.
grpc::ByteBuffer Sliced(const std::string& wire, size_t slice) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += slice) {
    slices.emplace_back(wire.data() + at, std::min(slice, wire.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

using test_support::Canonical;

using inference::ModelInferRequest;
constexpr int kRawField = ModelInferRequest::kRawInputContentsFieldNumber;
const LiftPath kRawPath = {kRawField};
const LiftPath kInlinePath = {v1::ExecuteRequest::kInlineTensorsFieldNumber, 2,
                              v1::Tensor::kDataFieldNumber};

TEST(ParseLifting, LargeEntriesGoToBlocksAndTheRestParsesAsProtobufWould) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> raw = {RandomBytes(100, rng), RandomBytes(3 * kMiB + 7, rng),
                                        RandomBytes(ReceivePool::kMinLiftBytes, rng),
                                        RandomBytes(ReceivePool::kMinLiftBytes - 1, rng)};
  ModelInferRequest head;  // on the wire after the raw entries: protobuf merges in wire order
  head.set_model_name("matmul");
  head.set_id("r7");
  for (const char* name : {"a", "b"}) {
    auto* in = head.add_inputs();
    in->set_name(name);
    in->set_datatype("FP32");
    in->add_shape(3);
  }
  (*head.mutable_parameters())["algorithm"].set_string_param("auto");
  ModelInferRequest entries;
  for (const std::string& r : raw) entries.add_raw_input_contents(r);
  const std::string wire = entries.SerializeAsString() + head.SerializeAsString();

  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  grpc::ByteBuffer buffer = Sliced(wire, 7919);
  ModelInferRequest got;
  std::vector<LiftedEntry> lifted;
  ASSERT_TRUE(ParseLifting(&buffer, {kRawField}, *pool, &got, &lifted));

  ModelInferRequest want;
  ASSERT_TRUE(want.ParseFromString(wire));
  ASSERT_EQ(lifted.size(), raw.size());
  ASSERT_EQ(got.raw_input_contents_size(), static_cast<int>(raw.size()));
  for (size_t i = 0; i < raw.size(); ++i) {
    const bool large = raw[i].size() >= ReceivePool::kMinLiftBytes;
    EXPECT_EQ(!lifted[i].block.empty(), large) << "entry " << i;
    EXPECT_EQ(got.raw_input_contents(i).empty(), large) << "entry " << i;
    const absl::string_view bytes = LiftedAt(lifted, i, got.raw_input_contents(i));
    EXPECT_TRUE(bytes == raw[i]) << "entry " << i << " differs from what was sent";
    want.mutable_raw_input_contents(i)->clear();
    got.mutable_raw_input_contents(i)->clear();
  }
  EXPECT_EQ(Canonical(got), Canonical(want));
}

TEST(ParseLifting, RequestTraitsLiftOnlyWhenAPoolIsSet) {
  std::mt19937_64 rng(8);
  ModelInferRequest req;
  req.set_model_name("row_mean");
  req.add_raw_input_contents(RandomBytes(2 * kMiB, rng));
  const std::string wire = req.SerializeAsString();
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  using Traits = grpc::SerializationTraits<ParsedRequest<ModelInferRequest>>;
  {
    ParsedRequest<ModelInferRequest> parsed;
    parsed.lift_pool = pool.get();
    parsed.lift_path = &kRawPath;
    grpc::ByteBuffer buffer = Sliced(wire, 65536);
    ASSERT_TRUE(Traits::Deserialize(&buffer, &parsed).ok());
    ASSERT_TRUE(parsed.status.ok()) << parsed.status;
    ASSERT_EQ(parsed.lifted.size(), 1u);
    EXPECT_TRUE(parsed.message.raw_input_contents(0).empty());
    EXPECT_TRUE(LiftedAt(parsed.lifted, 0, parsed.message.raw_input_contents(0)) ==
                req.raw_input_contents(0));
  }
  EXPECT_GT(pool->cached_bytes(), 0u) << "the request's block went back to the pool";
  ParsedRequest<ModelInferRequest> plain;
  grpc::ByteBuffer buffer = Sliced(wire, 65536);
  ASSERT_TRUE(Traits::Deserialize(&buffer, &plain).ok());
  EXPECT_TRUE(plain.lifted.empty());
  EXPECT_TRUE(LiftedAt(plain.lifted, 0, plain.message.raw_input_contents(0)) == req.raw_input_contents(0));
}

TEST(ParseLifting, WireDataCutShortIsRefusedNamingTheEntry) {
  std::mt19937_64 rng(9);
  ModelInferRequest req;
  req.set_model_name("row_mean");
  req.add_raw_input_contents("small");
  req.add_raw_input_contents(RandomBytes(3 * kMiB, rng));
  const std::string wire = req.SerializeAsString();
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  ParsedRequest<ModelInferRequest> parsed;
  parsed.lift_pool = pool.get();
  parsed.lift_path = &kRawPath;
  grpc::ByteBuffer buffer = Sliced(wire.substr(0, wire.size() - kMiB), 4096);
  ASSERT_TRUE(grpc::SerializationTraits<ParsedRequest<ModelInferRequest>>::Deserialize(&buffer, &parsed).ok());
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status.message().find("raw_input_contents[1]"), std::string::npos) << parsed.status;
  EXPECT_TRUE(parsed.lifted.empty());
  EXPECT_EQ(pool->blocks_in_use(), 0u) << "the block of the entry read before the cut went back";
}

TEST(ParseLifting, ALengthPastTheEndMapsNothing) {
  // Field 7, length 1 GiB, then three bytes.
  const std::string wire = std::string("\x3a\x80\x80\x80\x80\x04", 6) + "abc";
  auto pool = ReceivePool::Create(nullptr, 4ull << 30);
  grpc::ByteBuffer buffer = Sliced(wire, 4);
  ModelInferRequest got;
  std::vector<LiftedEntry> lifted;
  EXPECT_FALSE(ParseLifting(&buffer, {kRawField}, *pool, &got, &lifted, /*min_lift_bytes=*/1));
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

// A map entry whose value claims more bytes than the entry holds: protobuf refuses the request,
// and so must the lifting parse (it would otherwise stop the value at the entry's end and read
// what follows the entry as top-level fields).
TEST(ParseLifting, ANestedLengthPastItsMessageIsRefusedAsProtobufDoes) {
  const auto ld = [](int field, const std::string& payload) {
    std::string out;
    {
      google::protobuf::io::StringOutputStream sink(&out);
      google::protobuf::io::CodedOutputStream o(&sink);
      o.WriteTag(static_cast<uint32_t>(field << 3 | 2));
      o.WriteVarint32(static_cast<uint32_t>(payload.size()));
      o.WriteString(payload);
    }
    return out;
  };
  // The value (field 2 of the entry) says 100 bytes and has 6; the entry ends there.
  const std::string value = std::string("\x12") + static_cast<char>(100) + ld(3, "abcd");
  const std::string wire = ld(2, ld(1, "x") + value) + ld(15, std::string(200, 't'));  // the message goes on past 100
  v1::ExecuteRequest want;
  ASSERT_FALSE(want.ParseFromString(wire));
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  grpc::ByteBuffer buffer = Sliced(wire, 3);
  v1::ExecuteRequest got;
  std::vector<LiftedEntry> lifted;
  EXPECT_FALSE(ParseLifting(&buffer, kInlinePath, *pool, &got, &lifted, /*min_lift_bytes=*/1));
}

TEST(ParseLifting, ARequestTooSmallToHoldALiftIsLeftToTheOrdinaryParse) {
  ModelInferRequest req;
  req.set_model_name("row_mean");
  req.add_raw_input_contents(std::string(1000, 'a'));
  const std::string wire = req.SerializeAsString();
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  grpc::ByteBuffer buffer = Sliced(wire, 512);
  ModelInferRequest got;
  std::vector<LiftedEntry> lifted;
  EXPECT_FALSE(ParseLifting(&buffer, kRawPath, *pool, &got, &lifted));
  buffer = Sliced(wire, 512);
  EXPECT_TRUE(ParseLifting(&buffer, kRawPath, *pool, &got, &lifted, /*min_lift_bytes=*/64));
  ASSERT_EQ(lifted.size(), 1u);
  EXPECT_TRUE(LiftedAt(lifted, 0, got.raw_input_contents(0)) == req.raw_input_contents(0));
}

TEST(ParseLifting, AFieldOffThePathAsLargeAsALiftLeavesTheRequestToTheOrdinaryParse) {
  ModelInferRequest req;
  req.set_model_name("row_mean");
  auto* in = req.add_inputs();
  in->set_name("x");
  for (uint64_t i = 0; i < ReceivePool::kMinLiftBytes / 4; ++i) in->mutable_contents()->add_fp32_contents(1.f);
  std::mt19937_64 rng(10);
  req.add_raw_input_contents(RandomBytes(2 * kMiB, rng));
  const std::string wire = req.SerializeAsString();
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  grpc::ByteBuffer buffer = Sliced(wire, 65536);
  ModelInferRequest got;
  std::vector<LiftedEntry> lifted;
  EXPECT_FALSE(ParseLifting(&buffer, kRawPath, *pool, &got, &lifted));
}

// Execute's inline tensors: {inline_tensors, the entry's value, data}, found by the entry's key.
v1::ExecuteRequest Inlines(const std::vector<std::pair<std::string, std::string>>& tensors) {
  v1::ExecuteRequest req;
  for (const auto& [name, data] : tensors) {
    v1::Tensor& t = (*req.mutable_inline_tensors())[name];
    t.set_dtype(v1::FLOAT32);
    t.add_shape(static_cast<int64_t>(data.size() / 4));
    t.set_data(data);
  }
  return req;
}

TEST(ParseLifting, ExecuteInlineDataIsLiftedAndFoundByItsTensorsName) {
  std::mt19937_64 rng(11);
  const std::string x = RandomBytes(3 * kMiB, rng), y = RandomBytes(100, rng);
  v1::ExecuteRequest req = Inlines({{"x", x}, {"y", y}});
  auto* node = req.add_nodes();
  node->set_id("s");
  node->set_op("sum");
  node->add_inputs()->set_inline_name("x");
  (*req.mutable_inline_tensors())["z"].mutable_shm()->set_region("r");
  req.add_outputs()->set_node("s");
  const std::string wire = req.SerializeAsString();
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  grpc::ByteBuffer buffer = Sliced(wire, 6151);
  v1::ExecuteRequest got;
  std::vector<LiftedEntry> lifted;
  ASSERT_TRUE(ParseLifting(&buffer, kInlinePath, *pool, &got, &lifted));
  ASSERT_EQ(lifted.size(), 1u);  // only the keys whose data was lifted
  ASSERT_TRUE(LiftedByKey(lifted, "x").has_value());
  EXPECT_TRUE(*LiftedByKey(lifted, "x") == x);
  EXPECT_FALSE(LiftedByKey(lifted, "y").has_value());
  EXPECT_FALSE(LiftedByKey(lifted, "z").has_value());
  EXPECT_TRUE(got.inline_tensors().at("x").data().empty());
  EXPECT_EQ(got.inline_tensors().at("y").data(), y);
  (*got.mutable_inline_tensors())["x"].set_data(x);
  EXPECT_EQ(Canonical(got), Canonical(req));
}

TEST(ParseLifting, ARepeatedInlineNameKeepsTheLastEntryAsProtobufDoes) {
  std::mt19937_64 rng(12);
  const std::string big = RandomBytes(2 * kMiB, rng), small = RandomBytes(64, rng);
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  for (const bool big_last : {false, true}) {
    SCOPED_TRACE(big_last ? "large entry last" : "small entry last");
    const std::string wire = big_last ? Inlines({{"x", small}}).SerializeAsString() + Inlines({{"x", big}}).SerializeAsString()
                                      : Inlines({{"x", big}}).SerializeAsString() + Inlines({{"x", small}}).SerializeAsString();
    grpc::ByteBuffer buffer = Sliced(wire, 4096);
    v1::ExecuteRequest got, want;
    ASSERT_TRUE(want.ParseFromString(wire));
    std::vector<LiftedEntry> lifted;
    ASSERT_TRUE(ParseLifting(&buffer, kInlinePath, *pool, &got, &lifted));
    const std::optional<absl::string_view> v = LiftedByKey(lifted, "x");
    const std::string data = v ? std::string(*v) : got.inline_tensors().at("x").data();
    EXPECT_TRUE(data == want.inline_tensors().at("x").data());
    EXPECT_TRUE(data == (big_last ? big : small));
  }
}
}  // namespace
}  // namespace opserve
