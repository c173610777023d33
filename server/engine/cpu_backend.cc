#include "server/engine/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/guarded_copy.h"

namespace opserve {
namespace {

// 64-byte alignment: a cache line, and what vectorized reference loops like.
constexpr uint64_t kAlign = 64;

class HostBuffer final : public Buffer {
 public:
  HostBuffer(void* data, uint64_t bytes, MemoryBudget* budget) : Buffer(data, bytes), budget_(budget) {}
  ~HostBuffer() override {
    std::free(data());
    budget_->Release(bytes());
  }

 private:
  MemoryBudget* budget_;
};

class CpuExecEnv final : public ExecEnv {
 public:
  explicit CpuExecEnv(Backend* backend) : backend_(backend) {}
  absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) override { return backend_->Allocate(bytes); }
  // Guarded: `src` may be a client's shared memory region (guarded_copy.h).
  absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) override {
    return GuardedCopy(dst.data(), src, bytes);
  }
  absl::Status Fill(Buffer& dst, uint8_t byte, uint64_t bytes) override {
    std::memset(dst.data(), byte, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Scratch(uint64_t bytes) override {
    scratch_.emplace_back(new char[bytes]);
    return scratch_.back().get();
  }
  void MarkStart(int i) override { Resize(i)[i].first = Clock::now(); }
  void MarkEnd(int i) override { Resize(i)[i].second = Clock::now(); }
  absl::StatusOr<std::vector<double>> Finish(int num_nodes) override {
    Resize(num_nodes - 1);
    std::vector<double> seconds(num_nodes);
    for (int i = 0; i < num_nodes; ++i) {
      seconds[i] = std::chrono::duration<double>(marks_[i].second - marks_[i].first).count();
    }
    marks_.clear();
    scratch_.clear();
    return seconds;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<Clock::time_point, Clock::time_point>>& Resize(int i) {
    if (static_cast<int>(marks_.size()) <= i) marks_.resize(i + 1);
    return marks_;
  }
  std::vector<std::pair<Clock::time_point, Clock::time_point>> marks_;
  Backend* backend_;
  std::vector<std::unique_ptr<char[]>> scratch_;
};

class CpuUploader final : public Uploader {
 public:
  explicit CpuUploader(BufferPtr dst) : dst_(std::move(dst)) {}
  absl::Status Append(const void* data, uint64_t bytes) override {
    if (bytes > dst_->bytes() - offset_) {
      return absl::InvalidArgumentError("upload overruns its buffer");
    }
    std::memcpy(static_cast<char*>(dst_->data()) + offset_, data, bytes);
    offset_ += bytes;
    return absl::OkStatus();
  }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  BufferPtr dst_;
  uint64_t offset_ = 0;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(uint64_t budget, std::string device) : budget_(budget), device_(std::move(device)) {}
  std::string name() const override { return "cpu"; }
  std::string device() const override { return device_; }
  std::string description() const override { return device_ + " (reference backend)"; }

  absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) override {
    RETURN_IF_ERROR(budget_.Reserve(bytes));
    const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      budget_.Release(bytes);
      return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
    return std::make_shared<HostBuffer>(p, bytes, &budget_);
  }
  // Both guarded: a client's shared memory region may be the destination or the source
  // (guarded_copy.h).
  absl::Status CopyOut(const Buffer& src, uint64_t offset, void* dst, uint64_t bytes) override {
    return GuardedCopy(dst, static_cast<const char*>(src.data()) + offset, bytes);
  }
  absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) override {
    return GuardedCopy(dst.data(), src, bytes);
  }
  std::unique_ptr<Uploader> NewUploader(BufferPtr dst) override {
    return std::make_unique<CpuUploader>(std::move(dst));
  }
  absl::StatusOr<std::unique_ptr<ExecEnv>> NewExecEnv(ExecEnv* /*share_stream_of*/) override {
    return std::make_unique<CpuExecEnv>(this);
  }
  MemoryStats Memory() const override {
    const uint64_t total =
        static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    return {budget_.used(), budget_.budget(), total};
  }

 private:
  MemoryBudget budget_;
  const std::string device_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(uint64_t budget_bytes, std::string device,
                                        int devices_on_host) {
  if (budget_bytes == 0) {
    budget_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2 /
                   static_cast<uint64_t>(std::max(devices_on_host, 1));
  }
  return std::make_unique<CpuBackend>(budget_bytes, std::move(device));
}

}  // namespace opserve
