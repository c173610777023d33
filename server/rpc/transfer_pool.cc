#include "server/rpc/transfer_pool.h"

namespace opserve {

TransferPool::TransferPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back(&TransferPool::Loop, this);
}

TransferPool::~TransferPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TransferPool::Post(std::function<void()> step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(std::move(step));
  }
  cv_.notify_one();
}

void TransferPool::Loop() {
  for (;;) {
    std::function<void()> step;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !steps_.empty(); });
      if (steps_.empty()) return;  // stopping, and nothing is left
      step = std::move(steps_.front());
      steps_.pop_front();
    }
    step();
  }
}

}  // namespace opserve
