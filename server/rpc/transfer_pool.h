// Threads for the steps of PutTensor and GetTensor that may wait on the device: staging a chunk
// through pinned memory, a device-to-host copy, the final wait of an upload. The streaming
// reactors post those steps here, so gRPC's threads never block on the GPU; each call has at
// most one step queued or running at a time, so its steps run in order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace opserve {

class TransferPool {
 public:
  explicit TransferPool(int threads);
  // Runs every step already posted, then joins the threads.
  ~TransferPool();
  TransferPool(const TransferPool&) = delete;
  TransferPool& operator=(const TransferPool&) = delete;

  void Post(std::function<void()> step);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> steps_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace opserve
