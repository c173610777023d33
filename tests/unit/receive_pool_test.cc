// ReceivePool (server/rpc/receive_pool.h): blocks are reused, idle ones are bounded, and blocks
// stay valid past the pool's owner. ParseLifting and the request traits that call it, on
// ModelInferRequests split over many gRPC slices (no gRPC threads or calls: byte buffers only).
#include "server/rpc/receive_pool.h"

#include <gtest/gtest.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "inference/grpc_service.pb.h"
#include "server/rpc/request_parsing.h"

namespace opserve {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(ReceivePool, AReleasedBlockIsHandedOutAgain) {
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  auto a = pool->Acquire(3 * kMiB + 5);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes(), 3 * kMiB + 5);
  std::memset(a->data(), 0x5a, a->bytes());  // the whole block is writable
  char* const first = a->data();
  EXPECT_EQ(pool->cached_bytes(), 0u);
  a->Reset();
  EXPECT_GE(pool->cached_bytes(), 3 * kMiB + 5);
  auto b = pool->Acquire(3 * kMiB);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

TEST(ReceivePool, AnIdleBlockTooSmallOrTwiceTooLargeIsNotUsed) {
  auto pool = ReceivePool::Create(nullptr, 256 * kMiB);
  char* small_ptr = nullptr;
  char* large_ptr = nullptr;
  {
    auto small = pool->Acquire(kMiB);
    auto large = pool->Acquire(64 * kMiB);
    ASSERT_TRUE(small.ok() && large.ok());
    small_ptr = small->data();
    large_ptr = large->data();
  }
  auto mid = pool->Acquire(8 * kMiB);  // the small one does not fit; the large one wastes 7/8
  ASSERT_TRUE(mid.ok());
  EXPECT_NE(mid->data(), small_ptr);
  EXPECT_NE(mid->data(), large_ptr);
  auto big = pool->Acquire(40 * kMiB);  // the large one: at most twice the size asked
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->data(), large_ptr);
}

TEST(ReceivePool, IdleBlocksBeyondTheCapAreUnmappedOldestFirst) {
  auto pool = ReceivePool::Create(nullptr, 8 * kMiB);
  char* second = nullptr;
  {
    auto a = pool->Acquire(6 * kMiB);
    auto b = pool->Acquire(6 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok());
    second = b->data();
    a->Reset();  // idle: 6 MiB
    b->Reset();  // idle: 12 MiB > 8, so the older one goes
  }
  EXPECT_LE(pool->cached_bytes(), 8 * kMiB);
  EXPECT_GT(pool->cached_bytes(), 0u);
  auto c = pool->Acquire(6 * kMiB);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data(), second);
}

TEST(ReceivePool, ABlockOutlivesTheLastOtherOwnerOfThePool) {
  auto pool = ReceivePool::Create(nullptr, 64 * kMiB);
  auto a = pool->Acquire(2 * kMiB);
  ASSERT_TRUE(a.ok());
  pool.reset();
  std::memset(a->data(), 1, a->bytes());
  ReceivePool::Block moved = *std::move(a);
  EXPECT_FALSE(moved.empty());
  moved.Reset();  // frees the pool itself (ASan would see a use after free or a leak)
  EXPECT_TRUE(moved.empty());
}

TEST(ReceivePool, ThreadsNeverShareABlock) {
  auto pool = ReceivePool::Create(nullptr, 32 * kMiB);
  constexpr int kThreads = 4;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        auto b = pool->Acquire((1 + (i + t) % 3) * kMiB);
        if (!b.ok()) {
          ++bad[t];
          continue;
        }
        std::memset(b->data(), t + 1, b->bytes());
        std::this_thread::yield();
        for (uint64_t j = 0; j < b->bytes(); j += 4093) bad[t] += b->data()[j] != t + 1;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_LE(pool->cached_bytes(), 32 * kMiB);
}

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

using inference::ModelInferRequest;
constexpr int kRawField = ModelInferRequest::kRawInputContentsFieldNumber;

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
  std::vector<ReceivePool::Block> lifted;
  ASSERT_TRUE(ParseLifting(&buffer, kRawField, *pool, &got, &lifted));

  ModelInferRequest want;
  ASSERT_TRUE(want.ParseFromString(wire));
  ASSERT_EQ(lifted.size(), raw.size());
  ASSERT_EQ(got.raw_input_contents_size(), static_cast<int>(raw.size()));
  for (size_t i = 0; i < raw.size(); ++i) {
    const bool large = raw[i].size() >= ReceivePool::kMinLiftBytes;
    EXPECT_EQ(!lifted[i].empty(), large) << "entry " << i;
    EXPECT_EQ(got.raw_input_contents(i).empty(), large) << "entry " << i;
    const absl::string_view bytes = large ? lifted[i].view() : got.raw_input_contents(i);
    EXPECT_TRUE(bytes == raw[i]) << "entry " << i << " differs from what was sent";
    want.mutable_raw_input_contents(i)->clear();
    got.mutable_raw_input_contents(i)->clear();
  }
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
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
    parsed.lift_field = kRawField;
    grpc::ByteBuffer buffer = Sliced(wire, 65536);
    ASSERT_TRUE(Traits::Deserialize(&buffer, &parsed).ok());
    ASSERT_TRUE(parsed.status.ok()) << parsed.status;
    ASSERT_EQ(parsed.lifted.size(), 1u);
    EXPECT_TRUE(parsed.message.raw_input_contents(0).empty());
    EXPECT_TRUE(parsed.Lifted(parsed.message.raw_input_contents(0), 0) == req.raw_input_contents(0));
  }
  EXPECT_GT(pool->cached_bytes(), 0u) << "the request's block went back to the pool";
  ParsedRequest<ModelInferRequest> plain;
  grpc::ByteBuffer buffer = Sliced(wire, 65536);
  ASSERT_TRUE(Traits::Deserialize(&buffer, &plain).ok());
  EXPECT_TRUE(plain.lifted.empty());
  EXPECT_TRUE(plain.Lifted(plain.message.raw_input_contents(0), 0) == req.raw_input_contents(0));
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
  parsed.lift_field = kRawField;
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
  std::vector<ReceivePool::Block> lifted;
  EXPECT_FALSE(ParseLifting(&buffer, kRawField, *pool, &got, &lifted));
  EXPECT_EQ(pool->cached_bytes(), 0u);
}

}  // namespace
}  // namespace opserve
