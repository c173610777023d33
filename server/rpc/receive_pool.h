// Host blocks that large request fields (ModelInfer's raw_input_contents, Execute's inline tensor
// data; lifted_parse.h) are received into, reused from call to call.
//
// Protobuf parses a 128 MiB `bytes` field into a fresh std::string: glibc maps every block over
// 32 MiB anew and unmaps it on free, and the string grows by doubling past 50 MB, so each such
// request pays a page fault per 4 KiB and two extra copies (measured: three quarters of the
// server's time on a 128 MiB ModelInfer went to that parse). A block from this pool is mapped
// once, registered with the device once (Backend::RegisterHostMemory: uploads from it run at the
// host link's speed), and then only copied into.
//
// Blocks in use are bounded by the message size limit times the calls in flight, as the strings
// they replace were; idle blocks are kept up to `max_cached_bytes` and unmapped beyond it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/backend.h"

namespace opserve {

class ReceivePool : public std::enable_shared_from_this<ReceivePool> {
 public:
  // Fields smaller than this stay in the message: below it the parse costs little.
  static constexpr uint64_t kMinLiftBytes = 1 << 20;

  // `backend` (may be null: nothing registered) must outlive the pool and every block.
  static std::shared_ptr<ReceivePool> Create(Backend* backend, uint64_t max_cached_bytes);
  ~ReceivePool();
  ReceivePool(const ReceivePool&) = delete;
  ReceivePool& operator=(const ReceivePool&) = delete;

  // A block of at least `bytes` bytes, returned to the pool when the Block goes.
  class Block {
   public:
    Block() = default;
    Block(Block&& other) noexcept { *this = std::move(other); }
    Block& operator=(Block&& other) noexcept;
    ~Block() { Reset(); }
    void Reset();
    char* data() const { return data_; }
    uint64_t bytes() const { return bytes_; }  // what was asked for
    absl::string_view view() const { return absl::string_view(data_, bytes_); }
    bool empty() const { return data_ == nullptr; }

   private:
    friend class ReceivePool;
    std::shared_ptr<ReceivePool> pool_;
    char* data_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // RESOURCE_EXHAUSTED when the host cannot map it.
  absl::StatusOr<Block> Acquire(uint64_t bytes);

  uint64_t cached_bytes() const;   // idle, kept for the next Acquire
  size_t blocks_in_use() const;
  // Told (bytes mapped in use, idle) after every change, under the pool's lock: for the metrics.
  // Set before the first Acquire.
  void SetObserver(std::function<void(uint64_t in_use, uint64_t idle)> observer) {
    observer_ = std::move(observer);
  }

 private:
  struct Mapping {
    char* data = nullptr;
    uint64_t bytes = 0;
    bool registered = false;
  };
  ReceivePool(Backend* backend, uint64_t max_cached_bytes)
      : backend_(backend), max_cached_bytes_(max_cached_bytes) {}
  void Release(char* data);
  void Notify();  // under mu_
  void Unmap(const Mapping& m);

  Backend* const backend_;
  const uint64_t max_cached_bytes_;
  mutable std::mutex mu_;
  std::vector<Mapping> idle_;    // oldest first
  std::vector<Mapping> in_use_;  // what Release needs to know of a block: whether it is registered
  uint64_t cached_ = 0;
  uint64_t in_use_bytes_ = 0;
  std::function<void(uint64_t, uint64_t)> observer_;
};

}  // namespace opserve
