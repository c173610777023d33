// The CUDA collectives (server/engine/collectives.h) between every GPU of the machine: peer
// copies and broadcasts of fresh random bytes, checked bit for bit with guard bytes around each
// destination, through NCCL and through peer copies; and the measured rate of a 1 GiB peer copy
// and broadcast (printed, not held to a bound). Skipped with fewer than two GPUs.
//
// NCCL is loaded as libnccl.so.2, else from $OPSERVE_NCCL_LIBRARY. The NCCL tests skip when
// neither loads, and fail when $OPSERVE_NCCL_LIBRARY is set but NCCL still does not load.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/engine/collectives.h"

namespace opserve {
namespace {

constexpr uint64_t kSizes[] = {1, 7, 4099, (64ull << 20) + 3};
// Odd offsets: the destination and source start off any alignment a copy could rely on.
constexpr uint64_t kDstGuard = 61;
constexpr uint64_t kSrcOffset = 3;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint64_t kRateBytes = 1ull << 30;
constexpr int kRateRuns = 5;

// Every GPU, up to 8: a GPU can have peer access to at most 8 others (cudaErrorTooManyPeers).
std::vector<int> Gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  std::vector<int> out;
  for (int i = 0; i < std::min(n, 8); ++i) out.push_back(i);
  return out;
}

// xorshift64*: fresh random bytes (never a buffer of zeros), fast enough for a gibibyte.
std::vector<uint8_t> RandomBytes(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < n; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t v = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(out.data() + i, &v, std::min<uint64_t>(8, n - i));
  }
  return out;
}

#define CUDA_OK(expr)                                                             \
  do {                                                                            \
    const cudaError_t e_ = (expr);                                                \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);        \
  } while (0)

// Device memory on one GPU, freed with it.
class DeviceBytes {
 public:
  DeviceBytes(int ordinal, uint64_t bytes) : ordinal_(ordinal), bytes_(bytes) {
    cudaSetDevice(ordinal);
    if (cudaMalloc(&p_, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p_ = nullptr;
    }
  }
  ~DeviceBytes() {
    if (p_ == nullptr) return;
    cudaSetDevice(ordinal_);
    cudaFree(p_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  int ordinal() const { return ordinal_; }
  uint64_t bytes() const { return bytes_; }

 private:
  int ordinal_;
  uint64_t bytes_;
  void* p_ = nullptr;
};

// A destination on `ordinal`: n bytes with kDstGuard guard bytes before and after.
struct GuardedDst {
  GuardedDst(int ordinal, uint64_t n) : mem(ordinal, n + 2 * kDstGuard), n(n) {}
  uint8_t* data() const { return mem.get() + kDstGuard; }
  DeviceBytes mem;
  uint64_t n;
};

// Fills a guarded destination with the guard byte.
void Poison(const GuardedDst& d) {
  ASSERT_NE(d.mem.get(), nullptr);
  CUDA_OK(cudaSetDevice(d.mem.ordinal()));
  CUDA_OK(cudaMemset(d.mem.get(), kGuardByte, d.mem.bytes()));
  CUDA_OK(cudaDeviceSynchronize());
}

// Whether `d` holds `want` with its guards intact; with `want` null, whether it holds nothing
// but guard bytes.
void ExpectHolds(const GuardedDst& d, const std::vector<uint8_t>* want, const std::string& what) {
  std::vector<uint8_t> all(d.mem.bytes());
  CUDA_OK(cudaSetDevice(d.mem.ordinal()));
  CUDA_OK(cudaMemcpy(all.data(), d.mem.get(), all.size(), cudaMemcpyDeviceToHost));
  const auto body = all.begin() + kDstGuard;
  if (want == nullptr) {
    EXPECT_TRUE(std::all_of(all.begin(), all.end(), [](uint8_t b) { return b == kGuardByte; }))
        << what << ": a skipped destination was written";
    return;
  }
  const auto mismatch = std::mismatch(want->begin(), want->end(), body);
  EXPECT_TRUE(mismatch.first == want->end())
      << what << ": first wrong byte at " << (mismatch.first - want->begin()) << " of " << d.n;
  EXPECT_TRUE(std::all_of(all.begin(), body, [](uint8_t b) { return b == kGuardByte; }))
      << what << ": bytes before the destination were written";
  EXPECT_TRUE(std::all_of(body + d.n, all.end(), [](uint8_t b) { return b == kGuardByte; }))
      << what << ": bytes after the destination were written";
}

// The source bytes on `ordinal`, at kSrcOffset into their allocation.
struct Source {
  Source(int ordinal, const std::vector<uint8_t>& bytes)
      : mem(ordinal, bytes.size() + kSrcOffset) {}
  uint8_t* data() const { return mem.get() + kSrcOffset; }
  DeviceBytes mem;
};

void Upload(const Source& s, const std::vector<uint8_t>& bytes) {
  ASSERT_NE(s.mem.get(), nullptr);
  CUDA_OK(cudaSetDevice(s.mem.ordinal()));
  CUDA_OK(cudaMemcpy(s.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// With NCCL (GetParam() true) or forced onto peer copies.
class CudaCollectivesTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    gpus_ = Gpus();
    if (gpus_.size() < 2) GTEST_SKIP() << "fewer than two GPUs (" << gpus_.size() << ")";
    if (GetParam()) {
      collectives_ = NewCudaCollectives(gpus_);
      if (collectives_->name().rfind("nccl ", 0) != 0) {
        const char* path = std::getenv("OPSERVE_NCCL_LIBRARY");
        if (path != nullptr && *path != '\0') {
          FAIL() << "OPSERVE_NCCL_LIBRARY=" << path << " but broadcasts run on "
                 << collectives_->name();
        }
        GTEST_SKIP() << "NCCL not found (libnccl.so.2 on the loader's path, or "
                        "OPSERVE_NCCL_LIBRARY=/path/to/libnccl.so.2)";
      }
    } else {
      // A library that cannot load, and NCCL refused besides: libnccl.so.2 may already be
      // loaded into this process, and a loaded library is found by its name.
      ScopedEnv env("OPSERVE_NCCL_LIBRARY", "/nonexistent");
      collectives_ = NewCudaCollectives(gpus_, /*allow_nccl=*/false);
      ASSERT_EQ(collectives_->name(), "cuda peer copies");
    }
    std::printf("broadcasts on %s\n%s", collectives_->name().c_str(),
                collectives_->Topology().c_str());
  }

  int n() const { return static_cast<int>(gpus_.size()); }

  std::vector<int> gpus_;
  std::unique_ptr<Collectives> collectives_;
};

TEST_P(CudaCollectivesTest, CopyBetweenEveryPair) {
  uint64_t seed = 1;
  for (uint64_t bytes : kSizes) {
    for (int src = 0; src < n(); ++src) {
      for (int dst = 0; dst < n(); ++dst) {
        if (src == dst) continue;
        const std::string what = "copy of " + std::to_string(bytes) + " bytes from cuda:" +
                                 std::to_string(gpus_[src]) + " to cuda:" +
                                 std::to_string(gpus_[dst]);
        SCOPED_TRACE(what);
        const std::vector<uint8_t> data = RandomBytes(bytes, seed++);
        Source s(gpus_[src], data);
        Upload(s, data);
        GuardedDst d(gpus_[dst], bytes);
        Poison(d);
        // The call restores the thread's device, whichever it was.
        CUDA_OK(cudaSetDevice(gpus_[(dst + 1) % n()]));
        const absl::Status st = collectives_->Copy(dst, d.data(), src, s.data(), bytes);
        ASSERT_TRUE(st.ok()) << st;
        int current = -1;
        CUDA_OK(cudaGetDevice(&current));
        EXPECT_EQ(current, gpus_[(dst + 1) % n()]);
        ExpectHolds(d, &data, what);
      }
    }
  }
}

TEST_P(CudaCollectivesTest, BroadcastFromEachEnd) {
  uint64_t seed = 1000;
  for (uint64_t bytes : kSizes) {
    for (int root : {0, n() - 1}) {
      // Every device, then (from three devices on) one skipped, which runs as peer copies.
      for (int skipped : {-1, n() >= 3 ? (root + 1) % n() : -2}) {
        if (skipped == -2) continue;
        const std::string what = "broadcast of " + std::to_string(bytes) + " bytes from cuda:" +
                                 std::to_string(gpus_[root]) +
                                 (skipped >= 0 ? ", cuda:" + std::to_string(gpus_[skipped]) +
                                                     " skipped"
                                               : "");
        SCOPED_TRACE(what);
        const std::vector<uint8_t> data = RandomBytes(bytes, seed++);
        std::vector<std::unique_ptr<GuardedDst>> bufs;
        std::vector<void*> ptrs;
        for (int i = 0; i < n(); ++i) {
          bufs.push_back(std::make_unique<GuardedDst>(gpus_[i], bytes));
          Poison(*bufs.back());
          ptrs.push_back(i == skipped ? nullptr : bufs.back()->data());
        }
        CUDA_OK(cudaSetDevice(gpus_[root]));
        CUDA_OK(cudaMemcpy(bufs[root]->data(), data.data(), bytes, cudaMemcpyHostToDevice));
        const absl::Status st = collectives_->Broadcast(root, ptrs, bytes);
        ASSERT_TRUE(st.ok()) << st;
        for (int i = 0; i < n(); ++i) {
          ExpectHolds(*bufs[i], i == skipped ? nullptr : &data,
                      what + ", on cuda:" + std::to_string(gpus_[i]));
        }
      }
    }
  }
}

// A broadcast left running in blocks of columns: each destination's arrival lists its blocks,
// each block (those bytes of every row) is there once its event has fired, for a stream that
// waits for it, and Finish waits for the rest.
TEST_P(CudaCollectivesTest, StartedBroadcastArrivesBlockByBlock) {
  struct Shape {
    uint64_t rows, row_bytes;
  };
  uint64_t seed = 2000;
  for (const Shape& shape : {Shape{1, 1}, Shape{3, 7}, Shape{17, 4099}, Shape{1024, 65539}}) {
    const uint64_t rows = shape.rows, row_bytes = shape.row_bytes, bytes = rows * row_bytes;
    std::vector<uint64_t> ends;
    if (row_bytes / 3 + 1 < row_bytes) ends.push_back(row_bytes / 3 + 1);
    ends.push_back(row_bytes);
    for (int root : {0, n() - 1}) {
      const std::string what = "started broadcast of " + std::to_string(rows) + " rows of " +
                               std::to_string(row_bytes) + " bytes in " +
                               std::to_string(ends.size()) + " blocks from cuda:" +
                               std::to_string(gpus_[root]);
      SCOPED_TRACE(what);
      const std::vector<uint8_t> data = RandomBytes(bytes, seed++);
      std::vector<std::unique_ptr<GuardedDst>> bufs;
      std::vector<void*> ptrs;
      for (int i = 0; i < n(); ++i) {
        bufs.push_back(std::make_unique<GuardedDst>(gpus_[i], bytes));
        Poison(*bufs.back());
        ptrs.push_back(bufs.back()->data());
      }
      CUDA_OK(cudaSetDevice(gpus_[root]));
      CUDA_OK(cudaMemcpy(bufs[root]->data(), data.data(), bytes, cudaMemcpyHostToDevice));
      absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> b =
          collectives_->StartBroadcast(root, ptrs, rows, row_bytes, ends);
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ((*b)->arrival(root), nullptr);
      for (int i = 0; i < n(); ++i) {
        if (i == root) continue;
        std::shared_ptr<const InputArrival> a = (*b)->arrival(i);
        ASSERT_NE(a, nullptr) << "cuda:" << gpus_[i];
        EXPECT_EQ(a->rows, rows);
        EXPECT_EQ(a->row_bytes, row_bytes);
        EXPECT_EQ(a->ends, ends);
        ASSERT_EQ(a->events.size(), ends.size());
        // A reader's stream waits for each block in turn and copies just that block out.
        CUDA_OK(cudaSetDevice(gpus_[i]));
        cudaStream_t reader;
        CUDA_OK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
        std::vector<uint8_t> got(bytes, 0);
        uint64_t begin = 0;
        for (size_t c = 0; c < ends.size(); ++c) {
          CUDA_OK(cudaStreamWaitEvent(reader, static_cast<cudaEvent_t>(a->events[c]), 0));
          CUDA_OK(cudaMemcpy2DAsync(got.data() + begin, row_bytes,
                                    static_cast<char*>(ptrs[i]) + begin, row_bytes,
                                    ends[c] - begin, rows, cudaMemcpyDeviceToHost, reader));
          begin = ends[c];
        }
        CUDA_OK(cudaStreamSynchronize(reader));
        CUDA_OK(cudaStreamDestroy(reader));
        EXPECT_TRUE(got == data) << "what cuda:" << gpus_[i] << " read block by block";
      }
      double us = -1;
      const absl::Status st = (*b)->Finish(&us);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_GT(us, 0);
      for (int i = 0; i < n(); ++i) {
        ExpectHolds(*bufs[i], &data, what + ", on cuda:" + std::to_string(gpus_[i]));
      }
    }
  }
}

TEST_P(CudaCollectivesTest, RefusesMalformedCalls) {
  DeviceBytes a(gpus_[0], 8), b(gpus_[1], 8);
  absl::Status s = collectives_->Copy(n(), a.get(), 0, b.get(), 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cuda:0, cuda:1"), std::string::npos) << s;
  std::vector<void*> ptrs(n(), nullptr);
  s = collectives_->Broadcast(0, ptrs, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("8 bytes"), std::string::npos) << s;
  ptrs.pop_back();
  s = collectives_->Broadcast(0, ptrs, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Blocks must ascend to the row's length.
  std::vector<void*> both = {a.get(), b.get()};
  both.resize(n(), nullptr);
  for (std::vector<uint64_t> ends : {std::vector<uint64_t>{4}, {4, 2, 8}, {}}) {
    absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> started =
        collectives_->StartBroadcast(0, both, 1, 8, ends);
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << started.status();
  }
}

// Seconds per run of `f`, the median of kRateRuns after one warm-up.
template <typename F>
double MedianSeconds(F f) {
  f();
  std::vector<double> s;
  for (int i = 0; i < kRateRuns; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

TEST_P(CudaCollectivesTest, RateOfOneGibibyte) {
  const std::vector<uint8_t> data = RandomBytes(kRateBytes, 7);
  std::vector<std::unique_ptr<DeviceBytes>> bufs;
  std::vector<void*> ptrs;
  for (int i = 0; i < n(); ++i) {
    bufs.push_back(std::make_unique<DeviceBytes>(gpus_[i], kRateBytes));
    ASSERT_NE(bufs.back()->get(), nullptr) << "1 GiB on cuda:" << gpus_[i];
    ptrs.push_back(bufs.back()->get());
  }
  CUDA_OK(cudaSetDevice(gpus_[0]));
  CUDA_OK(cudaMemcpy(ptrs[0], data.data(), kRateBytes, cudaMemcpyHostToDevice));
  absl::Status st;
  const double copy_s = MedianSeconds([&] {
    if (st.ok()) st = collectives_->Copy(1, ptrs[1], 0, ptrs[0], kRateBytes);
  });
  ASSERT_TRUE(st.ok()) << st;
  const double bcast_s = MedianSeconds([&] {
    if (st.ok()) st = collectives_->Broadcast(0, ptrs, kRateBytes);
  });
  ASSERT_TRUE(st.ok()) << st;
  std::printf("1 GiB peer copy cuda:%d -> cuda:%d (%s): %.1f GB/s (median of %d)\n", gpus_[0],
              gpus_[1], collectives_->PeerAccess(1, 0) ? "peer access" : "no peer access",
              kRateBytes / copy_s / 1e9, kRateRuns);
  std::printf("1 GiB broadcast from cuda:%d to %d GPUs on %s: %.1f GB/s per receiver "
              "(median of %d)\n",
              gpus_[0], n() - 1, collectives_->name().c_str(), kRateBytes / bcast_s / 1e9,
              kRateRuns);
  // The last receiver holds the bytes, bit for bit.
  std::vector<uint8_t> back(kRateBytes);
  CUDA_OK(cudaSetDevice(gpus_[n() - 1]));
  CUDA_OK(cudaMemcpy(back.data(), ptrs[n() - 1], kRateBytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(back == data);
}

// Where no GPU can be used (no driver): the collectives still build, and every call that would
// touch a device says which one and why, rather than crashing. Skipped where GPUs work.
TEST(CudaCollectivesWithoutGpu, CallsFailNamingTheDevice) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    GTEST_SKIP() << count << " GPUs are usable here";
  }
  (void)cudaGetLastError();
  auto c = NewCudaCollectives({0, 1});
  EXPECT_FALSE(c->PeerAccess(0, 1));
  EXPECT_NE(c->Topology().find("cuda:0 -> cuda:1: unusable"), std::string::npos) << c->Topology();
  uint8_t host[4] = {};
  absl::Status s = c->Copy(1, host, 0, host, sizeof(host));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("copy of 4 bytes from cuda:0 to cuda:1: "), std::string::npos) << s;
  std::vector<void*> ptrs = {host, host + 1};
  s = c->Broadcast(0, ptrs, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("broadcast of 1 bytes from cuda:0 to cuda:1: "), std::string::npos)
      << s;
  std::printf("%s\n", s.ToString().c_str());
  // Nothing to move is no device call, so it succeeds.
  EXPECT_TRUE(c->Copy(1, nullptr, 0, nullptr, 0).ok());
}

INSTANTIATE_TEST_SUITE_P(Collectives, CudaCollectivesTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("Nccl") : std::string("PeerCopies");
                         });

}  // namespace
}  // namespace opserve
