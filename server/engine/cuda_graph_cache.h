// CUDA-graph replay for one execution context: the graphs of recent request signatures, each
// captured once from the executor's node launches and replayed after with the request's own
// tensors bound in. Kept per context (not per device) because a graph bakes in its context's
// timing events and scratch, and a context runs one request at a time: an entry is never
// replayed while its last replay is still on the device, so updating or evicting it is safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/engine/cuda_node_timer.h"

namespace opserve {

class CudaGraphCache {
 public:
  // Scratch the graphs keep: memory from outside any stream (a graph may not allocate).
  using AllocateFn = std::function<absl::StatusOr<BufferPtr>(uint64_t bytes)>;
  // Points the context's library handles (cuBLAS) at a stream: the capture stream while a
  // capture is open, the lane's stream after.
  using BindFn = std::function<absl::Status(cudaStream_t stream)>;
  // `capacity` graphs at most, the least recently used evicted first; 0 disables the cache.
  CudaGraphCache(int capacity, AllocateFn allocate, BindFn bind)
      : capacity_(capacity), allocate_(std::move(allocate)), bind_(std::move(bind)) {}
  ~CudaGraphCache() { Clear(); }
  // Destroys every graph; none may be on the device.
  void Clear();
  CudaGraphCache(const CudaGraphCache&) = delete;
  CudaGraphCache& operator=(const CudaGraphCache&) = delete;

  // See ExecEnv::LaunchAsGraph. Graphs run on `stream`, the lane's. They are captured on
  // `capture_stream`, which only this context uses: work other threads queue on the lane's stream
  // meanwhile (the completion thread's stream-ordered frees) must not join the capture.
  // `stamps`: where the nodes' timestamps go, filled by a capture and kept with its graph, set
  // from the graph on a replay.
  absl::StatusOr<GraphReplay> Launch(cudaStream_t stream, cudaStream_t capture_stream,
                                     const std::string& key,
                                     std::span<const void* const> bindings,
                                     const std::function<absl::Status()>& launch,
                                     CudaNodeTimer::Stamps& stamps);
  // True while `launch` is being captured: timing marks become graph nodes, and Scratch comes
  // from CaptureScratch.
  bool capturing() const { return capturing_ != nullptr; }
  // The next piece of the capturing graph's scratch: the same sizes in the same order on every
  // capture of one signature, so a graph's scratch is allocated once.
  absl::StatusOr<void*> CaptureScratch(uint64_t bytes);

 private:
  struct Entry {
    std::string key;
    cudaGraphExec_t exec = nullptr;          // nullptr: the kernels cannot be captured
    std::vector<const void*> bindings;       // the addresses the graph was captured with
    std::vector<BufferPtr> scratch;
    CudaNodeTimer::Stamps stamps;            // where the graph writes its nodes' timestamps
  };
  // Captures `launch` into a graph; nullptr with OK when the kernels cannot be captured.
  absl::StatusOr<cudaGraph_t> Capture(cudaStream_t stream, cudaStream_t lane_stream, Entry& entry,
                                      const std::function<absl::Status()>& launch);
  Entry& Insert(Entry entry);

  const int capacity_;
  const AllocateFn allocate_;
  const BindFn bind_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  Entry* capturing_ = nullptr;
  size_t scratch_next_ = 0;
};

}  // namespace opserve
