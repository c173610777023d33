// PutTensor / GetTensor / ListTensors / DeleteTensor through the client library, against the
// real server: every dtype at ranks 0..4, a multi-chunk tensor of an odd size, and one tensor of
// more than 300 MiB with its upload and download rates printed.
#include <chrono>
#include <cstring>
#include <iostream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

using RoundTripTest = OpserveTest;

const std::vector<v1::DType> kDTypes = {v1::FLOAT32, v1::INT32, v1::INT64, v1::BFLOAT16};
const std::vector<std::vector<int64_t>> kRanks = {{}, {5}, {3, 7}, {2, 3, 5}, {2, 3, 4, 5}};

void ExpectInfo(const v1::TensorInfo& info, const std::string& name, const client::HostTensor& t) {
  EXPECT_EQ(info.name(), name);
  EXPECT_EQ(info.dtype(), t.dtype) << name;
  EXPECT_EQ(std::vector<int64_t>(info.shape().begin(), info.shape().end()), t.shape) << name;
  EXPECT_EQ(info.bytes(), t.data.size()) << name;
  EXPECT_EQ(info.device(), OpserveTest::ExpectedDevice()) << name;
}

TEST_F(RoundTripTest, EveryDtypeAtEveryRank) {
  std::map<std::string, client::HostTensor> sent;
  for (v1::DType dtype : kDTypes) {
    for (const auto& shape : kRanks) {
      const std::string name = absl::StrCat(client::DTypeName(dtype), "_rank", shape.size());
      // Random bits: every pattern must come back as it went, NaN payloads included.
      client::HostTensor t = RandomTensor(dtype, shape, rng_);
      absl::StatusOr<v1::TensorInfo> info = client().PutTensor(name, t, /*overwrite=*/false);
      ASSERT_TRUE(info.ok()) << name << ": " << info.status();
      ExpectInfo(*info, name, t);
      sent[name] = std::move(t);
    }
  }
  for (const auto& [name, t] : sent) {
    absl::StatusOr<client::HostTensor> got = client().GetTensor(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_EQ(got->dtype, t.dtype) << name;
    EXPECT_EQ(got->shape, t.shape) << name;
    EXPECT_TRUE(got->data == t.data) << name << ": bytes differ";
  }
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), sent.size());
  for (const v1::TensorInfo& info : *list) {
    ASSERT_EQ(sent.count(info.name()), 1u) << info.name();
    ExpectInfo(info, info.name(), sent[info.name()]);
  }
}

TEST_F(RoundTripTest, ManyChunksOfAnOddSize) {
  // Three full chunks and a short one of 12 bytes, both ways.
  const int64_t chunk = client().options().chunk_bytes;
  ASSERT_EQ(chunk % 4, 0);
  client::HostTensor t = RandomTensor(v1::FLOAT32, {3 * chunk / 4 + 3}, rng_);
  ASSERT_GT(static_cast<int64_t>(t.data.size()), 3 * client().options().chunk_bytes);
  ASSERT_TRUE(client().PutTensor("odd", t, false).ok());
  absl::StatusOr<client::HostTensor> got = client().GetTensor("odd");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->data == t.data);
}

TEST_F(RoundTripTest, OverwriteWithTheFlagReplaces) {
  client::HostTensor a = RandomTensor(v1::INT32, {4, 4}, rng_);
  client::HostTensor b = RandomTensor(v1::BFLOAT16, {3}, rng_);
  ASSERT_TRUE(client().PutTensor("x", a, false).ok());
  absl::StatusOr<v1::TensorInfo> info = client().PutTensor("x", b, /*overwrite=*/true);
  ASSERT_TRUE(info.ok()) << info.status();
  ExpectInfo(*info, "x", b);
  absl::StatusOr<client::HostTensor> got = client().GetTensor("x");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->dtype, v1::BFLOAT16);
  EXPECT_TRUE(got->data == b.data);
  EXPECT_EQ(client().ListTensors()->size(), 1u);
}

TEST_F(RoundTripTest, DeleteAndList) {
  client::HostTensor a = RandomTensor(v1::INT64, {2, 3}, rng_);
  client::HostTensor b = RandomTensor(v1::FLOAT32, {}, rng_);
  ASSERT_TRUE(client().PutTensor("a", a, false).ok());
  ASSERT_TRUE(client().PutTensor("dir/b:1", b, false).ok());

  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  std::set<std::string> names;
  for (const v1::TensorInfo& info : *list) {
    names.insert(info.name());
    ExpectInfo(info, info.name(), info.name() == "a" ? a : b);
  }
  EXPECT_EQ(names, (std::set<std::string>{"a", "dir/b:1"}));

  absl::StatusOr<v1::TensorInfo> deleted = client().DeleteTensor("a");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  ExpectInfo(*deleted, "a", a);  // what was deleted
  EXPECT_TRUE(StatusIs(client().GetTensor("a").status(), absl::StatusCode::kNotFound, {"'a'"}));
  EXPECT_TRUE(StatusIs(client().DeleteTensor("a").status(), absl::StatusCode::kNotFound, {"'a'"}));
  list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name(), "dir/b:1");

  // The name is free again, and the other tensor is untouched.
  ASSERT_TRUE(client().PutTensor("a", b, /*overwrite=*/false).ok());
  absl::StatusOr<client::HostTensor> got = client().GetTensor("dir/b:1");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->data == b.data);
  ASSERT_TRUE(client().DeleteTensor("a").ok());
  ASSERT_TRUE(client().DeleteTensor("dir/b:1").ok());
  list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

TEST_F(RoundTripTest, ConcurrentPutsOfOneNameExactlyOneWins) {
  constexpr int kClients = 6;
  std::vector<client::HostTensor> tensors;
  for (int i = 0; i < kClients; ++i) tensors.push_back(RandomTensor(v1::INT32, {64 * 1024}, rng_));
  std::vector<absl::Status> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      results[i] = client().PutTensor("contested", tensors[i], /*overwrite=*/false).status();
    });
  }
  for (auto& t : threads) t.join();
  int winner = -1;
  for (int i = 0; i < kClients; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(winner, -1) << "two uploads of one name both succeeded";
      winner = i;
    } else {
      EXPECT_TRUE(StatusIs(results[i], absl::StatusCode::kAlreadyExists, {"'contested'"}));
    }
  }
  ASSERT_NE(winner, -1);
  absl::StatusOr<client::HostTensor> got = client().GetTensor("contested");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->data == tensors[winner].data) << "the stored bytes are not the winner's";
}

// Over 300 MiB in 1 MiB chunks each way, with the rates printed and recorded.
TEST_F(RoundTripTest, LargeTensorInChunks) {
  // FLOAT32[75, 1048577]: 314,573,100 bytes, just over 300 MiB and not a multiple of the chunk.
  const std::vector<int64_t> shape = {75, 1048577};
  client::HostTensor t = RandomTensor(v1::FLOAT32, shape, rng_);
  ASSERT_GE(t.data.size(), 300u << 20);
  using Clock = std::chrono::steady_clock;

  const auto t0 = Clock::now();
  absl::StatusOr<v1::TensorInfo> info = client().PutTensor("big", t, false);
  const double up_s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_TRUE(info.ok()) << info.status();
  ExpectInfo(*info, "big", t);

  const auto t1 = Clock::now();
  absl::StatusOr<client::HostTensor> got = client().GetTensor("big");
  const double down_s = std::chrono::duration<double>(Clock::now() - t1).count();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->shape, shape);
  ASSERT_EQ(got->data.size(), t.data.size());
  EXPECT_EQ(std::memcmp(got->data.data(), t.data.data(), t.data.size()), 0) << "bytes differ";

  const double gb = t.data.size() / 1e9;
  std::cout << "[ RATE     ] " << t.data.size() << " bytes in " << client().options().chunk_bytes
            << "-byte chunks: upload " << gb / up_s << " GB/s (" << up_s << " s), download "
            << gb / down_s << " GB/s (" << down_s << " s)" << std::endl;
  RecordProperty("bytes", std::to_string(t.data.size()));
  RecordProperty("upload_GBps", std::to_string(gb / up_s));
  RecordProperty("download_GBps", std::to_string(gb / down_s));
  EXPECT_TRUE(client().DeleteTensor("big").ok());
}

}  // namespace
}  // namespace opserve::e2e
