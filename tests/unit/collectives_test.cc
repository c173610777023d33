// The host collectives (the CPU backend's cpu:N devices): copies and broadcasts bit for bit at
// the edge sizes, bytes around the destination left alone, and every malformed call refused
// with a message that names the devices and bytes.
#include "server/engine/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace opserve {
namespace {

constexpr uint64_t kSizes[] = {0, 1, 7, 4099, 64ull << 20};
constexpr size_t kGuard = 64;  // bytes on each side of a destination that must not change
constexpr uint8_t kGuardByte = 0xA5;

std::vector<uint8_t> RandomBytes(uint64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

// A destination with kGuard guard bytes before and after it.
struct Guarded {
  explicit Guarded(uint64_t n) : all(n + 2 * kGuard, kGuardByte) {}
  uint8_t* data() { return all.data() + kGuard; }
  bool Matches(const std::vector<uint8_t>& want) const {
    return std::equal(want.begin(), want.end(), all.begin() + kGuard);
  }
  bool GuardsIntact(uint64_t n) const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (all[i] != kGuardByte || all[kGuard + n + i] != kGuardByte) return false;
    }
    return true;
  }
  std::vector<uint8_t> all;
};

TEST(HostCollectives, NameAndTopology) {
  auto c = NewHostCollectives(3);
  EXPECT_EQ(c->name(), "host copies");
  EXPECT_TRUE(c->PeerAccess(0, 2));
  EXPECT_FALSE(c->PeerAccess(1, 1));
  EXPECT_FALSE(c->PeerAccess(0, 3));
  EXPECT_FALSE(c->PeerAccess(-1, 0));
  const std::string topo = c->Topology();
  EXPECT_NE(topo.find("cpu:0 -> cpu:1: "), std::string::npos) << topo;
  EXPECT_NE(topo.find("cpu:2 -> cpu:1: "), std::string::npos) << topo;
  EXPECT_EQ(std::count(topo.begin(), topo.end(), '\n'), 6) << topo;  // 3 * 2 ordered pairs
}

TEST(HostCollectives, CopyIsExact) {
  auto c = NewHostCollectives(2);
  uint32_t seed = 1;
  for (uint64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<uint8_t> src = RandomBytes(n, seed++);
    Guarded dst(n);
    ASSERT_TRUE(c->Copy(1, dst.data(), 0, src.data(), n).ok());
    EXPECT_TRUE(dst.Matches(src));
    EXPECT_TRUE(dst.GuardsIntact(n));
  }
}

TEST(HostCollectives, CopyOfNothingTakesNullPointers) {
  auto c = NewHostCollectives(2);
  EXPECT_TRUE(c->Copy(0, nullptr, 1, nullptr, 0).ok());
}

TEST(HostCollectives, BroadcastReachesEveryDeviceButSkipped) {
  auto c = NewHostCollectives(4);
  uint32_t seed = 100;
  for (uint64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<uint8_t> data = RandomBytes(n, seed++);
    for (int root : {0, 2}) {
      SCOPED_TRACE(root);
      std::vector<Guarded> bufs;
      for (int i = 0; i < 4; ++i) bufs.emplace_back(n);
      std::copy(data.begin(), data.end(), bufs[root].data());
      // Device 3 is skipped: its bytes must stay as they were.
      std::vector<void*> ptrs = {bufs[0].data(), bufs[1].data(), bufs[2].data(), nullptr};
      ASSERT_TRUE(c->Broadcast(root, ptrs, n).ok());
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(bufs[i].Matches(data)) << "device " << i;
        EXPECT_TRUE(bufs[i].GuardsIntact(n)) << "device " << i;
      }
      EXPECT_TRUE(std::all_of(bufs[3].all.begin(), bufs[3].all.end(),
                              [](uint8_t b) { return b == kGuardByte; }));
    }
  }
}

TEST(HostCollectives, OneDeviceBroadcastIsANoOp) {
  auto c = NewHostCollectives(1);
  std::vector<uint8_t> data = RandomBytes(33, 7);
  const std::vector<uint8_t> before = data;
  std::vector<void*> ptrs = {data.data()};
  ASSERT_TRUE(c->Broadcast(0, ptrs, data.size()).ok());
  EXPECT_EQ(data, before);
}

TEST(HostCollectives, RefusesMalformedCalls) {
  auto c = NewHostCollectives(2);
  uint8_t a[8] = {}, b[8] = {};
  auto expect_invalid = [](const absl::Status& s, std::initializer_list<const char*> words) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (const char* w : words) EXPECT_NE(s.message().find(w), std::string::npos) << w << ": " << s;
  };
  expect_invalid(c->Copy(2, a, 0, b, 8), {"destination device 2", "8 bytes", "cpu:0, cpu:1"});
  expect_invalid(c->Copy(0, a, -1, b, 8), {"source device -1", "8 bytes"});
  expect_invalid(c->Copy(0, nullptr, 1, b, 8), {"null", "cpu:1", "cpu:0", "8 bytes"});
  expect_invalid(c->Copy(0, a, 1, nullptr, 3), {"null", "3 bytes"});

  std::vector<void*> two = {a, b};
  std::vector<void*> three = {a, b, a};
  std::vector<void*> null_root = {nullptr, b};
  expect_invalid(c->Broadcast(0, three, 8), {"3 pointers", "2 devices", "8 bytes"});
  expect_invalid(c->Broadcast(2, two, 8), {"root 2", "8 bytes"});
  expect_invalid(c->Broadcast(0, null_root, 8), {"root", "cpu:0", "null", "8 bytes"});
  // Nothing was written by the refused calls.
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(a[i] == 0 && b[i] == 0) << i;

  auto none = NewHostCollectives(0);
  expect_invalid(none->Copy(0, a, 0, b, 1), {"destination device 0", "none"});
}

}  // namespace
}  // namespace opserve
