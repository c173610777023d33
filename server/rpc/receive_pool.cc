#include "server/rpc/receive_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace opserve {
namespace {

// Mappings are whole 2 MiB pages, so the kernel can back them with huge pages (fewer faults on
// the first fill), and a block freed by one request fits the next of about the same size.
constexpr uint64_t kGranule = 2 << 20;

}  // namespace

std::shared_ptr<ReceivePool> ReceivePool::Create(Backend* backend, uint64_t max_cached_bytes) {
  return std::shared_ptr<ReceivePool>(new ReceivePool(backend, max_cached_bytes));
}

ReceivePool::~ReceivePool() {
  // Every block holds the pool, so none is in use here.
  for (const Mapping& m : idle_) Unmap(m);
}

ReceivePool::Block& ReceivePool::Block::operator=(Block&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void ReceivePool::Block::Reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Release(data_);
  data_ = nullptr;
  bytes_ = 0;
  pool_.reset();
}

absl::StatusOr<ReceivePool::Block> ReceivePool::Acquire(uint64_t bytes) {
  const uint64_t want = std::max<uint64_t>(kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  Block b;
  b.pool_ = shared_from_this();
  b.bytes_ = bytes;
  {
    // The smallest idle block that fits and wastes at most half of itself.
    std::lock_guard<std::mutex> lock(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->bytes >= want && it->bytes <= 2 * want && (best == idle_.end() || it->bytes < best->bytes)) {
        best = it;
      }
    }
    if (best != idle_.end()) {
      b.data_ = best->data;
      cached_ -= best->bytes;
      in_use_bytes_ += best->bytes;
      in_use_.push_back(*best);
      idle_.erase(best);
      Notify();
      return b;
    }
  }
  void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    b.pool_.reset();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", want, " bytes of host memory to receive a request field into"));
  }
  (void)madvise(p, want, MADV_HUGEPAGE);
  Mapping m{static_cast<char*>(p), want, false};
  // Registration is an optimisation: a block the device cannot pin still receives the bytes,
  // and the upload from it runs at pageable speed.
  if (backend_ != nullptr) m.registered = backend_->RegisterHostMemory(p, want).ok();
  b.data_ = m.data;
  std::lock_guard<std::mutex> lock(mu_);
  in_use_.push_back(m);
  in_use_bytes_ += m.bytes;
  Notify();
  return b;
}

void ReceivePool::Release(char* data) {
  std::vector<Mapping> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(in_use_.begin(), in_use_.end(), [&](const Mapping& m) { return m.data == data; });
    if (it == in_use_.end()) return;  // not ours: cannot happen, and unmapping it would be worse
    Mapping m = *it;
    in_use_.erase(it);
    in_use_bytes_ -= m.bytes;
    idle_.push_back(m);
    cached_ += m.bytes;
    while (cached_ > max_cached_bytes_ && !idle_.empty()) {
      cached_ -= idle_.front().bytes;
      drop.push_back(idle_.front());
      idle_.erase(idle_.begin());
    }
    Notify();
  }
  for (const Mapping& m : drop) Unmap(m);
}

void ReceivePool::Notify() {
  if (observer_) observer_(in_use_bytes_, cached_);
}

void ReceivePool::Unmap(const Mapping& m) {
  if (m.registered) backend_->UnregisterHostMemory(m.data);
  munmap(m.data, m.bytes);
}

size_t ReceivePool::blocks_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_.size();
}

uint64_t ReceivePool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace opserve
