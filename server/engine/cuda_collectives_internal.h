// The CUDA collectives' class and the helpers its two files share (cuda_collectives.cc: copies
// and blocking broadcasts; cuda_arriving_broadcast.cc: broadcasts left running in chunks).
// Internal to those files.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/engine/collectives.h"
#include "server/engine/nccl_api.h"

namespace opserve::cuda_collectives_internal {

// The runtime keeps a thread's last error until it is read, and launch checks elsewhere read
// it (cudaPeekAtLastError): an error handled here must not surface there.
inline cudaError_t Handled(cudaError_t e) {
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

inline std::string CudaText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// Restores the calling thread's current device, which every call here changes.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() {
    if (Handled(cudaGetDevice(&saved_)) != cudaSuccess) saved_ = -1;
  }
  ~KeepCurrentDevice() {
    int now = -1;
    if (saved_ >= 0 && (Handled(cudaGetDevice(&now)) != cudaSuccess || now != saved_)) {
      Handled(cudaSetDevice(saved_));
    }
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int saved_ = -1;
};

class CudaCollectives final : public Collectives {
 public:
  CudaCollectives(std::vector<int> ordinals, bool allow_nccl);
  ~CudaCollectives() override;

  std::string name() const override {
    return nccl_ok_.load(std::memory_order_acquire) ? nccl_.name : "cuda peer copies";
  }
  absl::Status Copy(int dst_dev, void* dst, int src_dev, const void* src, uint64_t bytes) override;
  absl::Status Broadcast(int root, std::span<void* const> ptrs, uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> StartBroadcast(
      int root, std::span<void* const> ptrs, uint64_t rows, uint64_t row_bytes,
      std::span<const uint64_t> ends) override;
  bool PeerAccess(int a, int b) const override {
    const int n = static_cast<int>(devices_.size());
    return a >= 0 && b >= 0 && a < n && b < n && links_[a][b].peer;
  }
  std::string Topology() const override;

 private:
  struct Device {
    int ordinal = 0;
    std::string name;             // "cuda:<ordinal>"
    cudaStream_t stream = nullptr;  // this object's own, non-blocking
    absl::Status ready;           // why the device cannot be used, if it cannot
  };
  struct Link {
    bool peer = false;
    int rank = -1;       // cudaDevP2PAttrPerformanceRank where peer access is on
    std::string note;    // why there is none, where that is not simply "the GPUs cannot"
  };

  friend class CudaArrivingBroadcast;

  absl::Status PeerBroadcast(int root, std::span<void* const> ptrs, uint64_t bytes);
  // The readiness checks Broadcast and StartBroadcast share; *every_device: no device skipped,
  // *any_target: something to copy.
  absl::Status CheckReady(int root, std::span<void* const> ptrs, uint64_t bytes,
                          bool* every_device, bool* any_target) const;
  // Whether NCCL runs this broadcast; takes nccl_mu_ into *lock when it does.
  bool UseNccl(bool every_device, std::unique_lock<std::mutex>* lock);
  // With nccl_mu_ held.
  absl::Status InitNccl();
  absl::Status NcclBroadcast(int root, std::span<void* const> ptrs, uint64_t bytes);
  void DisableNccl(const absl::Status& why);
  std::string Describe(int root, std::span<void* const> ptrs, uint64_t bytes) const;

  std::vector<Device> devices_;
  std::vector<std::string> names_;
  std::vector<std::vector<Link>> links_;  // [from][to]

  NcclApi nccl_;
  // NCCL loaded, its communicators not failed; cleared once for good when they fail.
  std::atomic<bool> nccl_ok_{false};
  // A communicator is used by one broadcast at a time (NCCL's rule for a communicator).
  std::mutex nccl_mu_;
  std::vector<ncclComm_t> comms_;  // one per device once made, guarded by nccl_mu_
  bool comms_broken_ = false;      // guarded by nccl_mu_
};

}  // namespace opserve::cuda_collectives_internal
