// The CUDA backend's class, shared by its two source files: cuda_backend.cc (device memory,
// copies, health) and cuda_exec_env.cc (the lanes' execution contexts). The rest of the server
// reaches the backend through cuda_backend.h alone.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/engine/backend.h"
#include "server/engine/pinned_pool.h"

namespace opserve {

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device, uint64_t budget,
                                                             int max_compute_capability,
                                                             int graph_cache);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device() const override { return absl::StrCat("cuda:", device_); }
  std::string description() const override { return description_; }
  int compute_capability() const override { return cc_; }
  std::string capability_source() const override { return capability_source_; }
  int sm_count() const override { return sm_count_; }
  int max_shared_memory_per_block() const override { return smem_per_block_; }

  absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) override;
  absl::Status CopyOut(const Buffer& src, uint64_t offset, void* dst, uint64_t bytes) override;
  absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) override;
  std::unique_ptr<Uploader> NewUploader(BufferPtr dst) override;
  void BindThread() override;
  absl::StatusOr<std::unique_ptr<ExecEnv>> NewExecEnv(ExecEnv* share_stream_of) override;
  absl::Status Healthy() const override;
  MemoryStats Memory() const override;
  absl::Status RegisterHostMemory(void* p, uint64_t bytes) override;
  void UnregisterHostMemory(void* p) override;
  absl::StatusOr<BufferPtr> OpenSharedDeviceMemory(absl::string_view handle, int64_t device_id,
                                                   uint64_t bytes) override;

  // For the buffers and the execution context.
  absl::StatusOr<BufferPtr> AllocateOn(uint64_t bytes, cudaStream_t stream);
  void Free(void* p, uint64_t bytes, cudaStream_t stream);
  cudaStream_t alloc_stream() const { return alloc_stream_; }
  // A stream for one lane's execution context. The backend owns it, so that buffers allocated
  // on it can still be freed on it after the context is gone (stored tensors outlive lanes).
  absl::StatusOr<cudaStream_t> NewLaneStream();
  absl::Status Check(cudaError_t err, absl::string_view what);
  PinnedPool& pinned() { return pinned_; }
  int device_index() const { return device_; }
  int graph_cache() const { return graph_cache_; }
  // Whether graphs time their nodes with the device's timer (CudaNodeTimer).
  bool timer_stamps() const { return timer_stamps_; }

 private:
  absl::Status CopyOutVia(PinnedPool::Block block, const Buffer& src, uint64_t offset, void* dst,
                          uint64_t bytes);
  CudaBackend(int device, uint64_t budget, int graph_cache)
      : device_(device), budget_(budget), graph_cache_(graph_cache) {}

  const int device_;
  MemoryBudget budget_;
  const int graph_cache_;  // graphs per execution context (CudaGraphCache)
  bool timer_stamps_ = false;
  std::string description_;
  int cc_ = 0;  // the GPU's own, or the cap below it (--max_compute_capability)
  std::string capability_source_;
  int sm_count_ = 0;
  int smem_per_block_ = 0;
  uint64_t total_ = 0;
  cudaStream_t alloc_stream_ = nullptr;    // allocations made off the worker (uploads)
  cudaStream_t copy_stream_ = nullptr;     // downloads (GetTensor, returned outputs)
  std::mutex copy_mu_;
  std::mutex lanes_mu_;
  std::vector<cudaStream_t> lane_streams_;  // destroyed with the backend
  PinnedPool pinned_;
  mutable std::mutex health_mu_;
  absl::Status health_;
};

// An execution context of a lane of `backend` (cuda_exec_env.cc): a new lane, or with
// `share_stream_of` (another of this backend's contexts) a context of that one's lane.
absl::StatusOr<std::unique_ptr<ExecEnv>> NewCudaExecEnv(CudaBackend* backend,
                                                        ExecEnv* share_stream_of);

}  // namespace opserve
