// Page-locked host blocks for staging copies. cudaMallocHost costs milliseconds, so blocks are
// made once and reused; the pool grows only while more transfers run at once than it holds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace opserve {

class PinnedPool {
 public:
  // 4 MiB: large enough that each cudaMemcpyAsync runs near bus speed, small enough that two
  // per upload stay cheap.
  static constexpr uint64_t kBlockBytes = 4 << 20;

  struct Block {
    void* ptr = nullptr;
    uint64_t bytes = 0;
  };

  Block Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        Block b = free_.back();
        free_.pop_back();
        return b;
      }
    }
    Block b{nullptr, kBlockBytes};
    if (cudaMallocHost(&b.ptr, kBlockBytes) != cudaSuccess) {
      cudaGetLastError();
      // Pageable memory still works, just slower.
      b.ptr = ::operator new(kBlockBytes);
      b.bytes = kBlockBytes;
      std::lock_guard<std::mutex> lock(mu_);
      pageable_.push_back(b.ptr);
    }
    return b;
  }

  void Release(Block b) {
    if (b.ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
  }

  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Block& b : free_) {
      bool pageable = false;
      for (void* p : pageable_) pageable |= (p == b.ptr);
      if (pageable) {
        ::operator delete(b.ptr);
      } else {
        cudaFreeHost(b.ptr);
      }
    }
    free_.clear();
    pageable_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<Block> free_;
  std::vector<void*> pageable_;
};

}  // namespace opserve
