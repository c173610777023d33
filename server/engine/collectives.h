// Copies and broadcasts among the devices of one node: what the engine uses to move a tensor's
// bytes from the device that holds them to the device that runs on them. Plain pointers and
// sizes, so any layer above can call it without CUDA headers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/ops/op.h"

namespace opserve {

// A broadcast under way (Collectives::StartBroadcast): each destination's bytes arrive chunk by
// chunk, as its arrival says, while the caller goes on.
class ArrivingBroadcast {
 public:
  virtual ~ArrivingBroadcast() = default;  // waits for the copies still running
  // What a reader on device i waits on; nullptr for the root and for skipped devices.
  virtual std::shared_ptr<const InputArrival> arrival(int device) const = 0;
  // Waits for every copy: the broadcast's status, and in *us the longest destination's time
  // from its first chunk's start to its last chunk's end.
  virtual absl::Status Finish(double* us) = 0;
};

// Copies and collectives among the devices of one node, by position in the node's device list.
// Every call is blocking and may come from any thread; a call that fails says which devices,
// pointers and byte count it was given.
class Collectives {
 public:
  virtual ~Collectives() = default;
  // "nccl 2.28.9", "cuda peer copies", "host copies": what Broadcast runs on.
  virtual std::string name() const = 0;
  // Blocking: copies `bytes` from src (on device src_dev) into dst (on device dst_dev).
  virtual absl::Status Copy(int dst_dev, void* dst, int src_dev, const void* src, uint64_t bytes) = 0;
  // Blocking: copies `bytes` at ptrs[root] into every other ptrs[i] (ptrs[i] on device i of the
  // list given at creation; nullptr entries are skipped).
  virtual absl::Status Broadcast(int root, std::span<void* const> ptrs, uint64_t bytes) = 0;
  // Broadcast's copies of `rows` rows of `row_bytes`, started and left running in blocks of
  // columns: block i is the bytes [ends[i - 1], ends[i]) of every row (ends ascend to row_bytes).
  // A reader waits for the blocks it needs (InputArrival). UNIMPLEMENTED where copies cannot run
  // beside the caller (host memcpy): call Broadcast.
  virtual absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> StartBroadcast(
      int root, std::span<void* const> ptrs, uint64_t rows, uint64_t row_bytes,
      std::span<const uint64_t> ends) {
    return absl::UnimplementedError("broadcasts here run to completion (Broadcast)");
  }
  // Peer access between device a and b (direct NVLink/PCIe peer copies), for reports. False
  // when a == b (no peer is involved) or either is not in the list.
  virtual bool PeerAccess(int a, int b) const = 0;
  // One line per pair, e.g. "cuda:0 -> cuda:1: peer access" (for the server log and PERFORMANCE.md).
  virtual std::string Topology() const = 0;
};

// n host "devices" (the CPU backend's cpu:N): memcpy for everything.
std::unique_ptr<Collectives> NewHostCollectives(int n);

#if OPSERVE_WITH_CUDA
// CUDA devices by ordinal. Enables peer access between every pair that can; Copy runs
// cudaMemcpyPeerAsync on a stream of the destination device that it owns (staged by the driver
// where there is no peer access), then waits for it. Broadcast runs NCCL when `allow_nccl` and
// libnccl.so.2 loads (as "libnccl.so.2", else from the path in $OPSERVE_NCCL_LIBRARY), its
// communicators made over the ordinals on the first Broadcast; otherwise, and for a broadcast
// that skips a device, peer copies from the root. StartBroadcast always runs peer copies: their
// copy engines run beside the readers' kernels, where NCCL's kernels would wait for the
// multiprocessors those hold. NVLink multicast stays off (NCCL_NVLS_ENABLE=0
// unless the environment sets it). The caller must have finished, or synchronised, whatever
// writes the source bytes on its own streams: these streams do not wait for others.
// The thread's current device is the caller's again when a call returns.
std::unique_ptr<Collectives> NewCudaCollectives(std::vector<int> ordinals, bool allow_nccl = true);
#endif

namespace collectives_internal {
// The checks both kinds share, with messages that name the devices (`names`) and bytes.
absl::Status CheckCopy(const std::vector<std::string>& names, int dst_dev, const void* dst,
                       int src_dev, const void* src, uint64_t bytes);
absl::Status CheckBroadcast(const std::vector<std::string>& names, int root,
                            std::span<void* const> ptrs, uint64_t bytes);
}  // namespace collectives_internal

}  // namespace opserve
