#include "server/engine/cuda_graph_cache.h"

#include <algorithm>

#include "common/status_macros.h"
#include "server/ops/cuda_launch.h"

namespace opserve {

using cuda::FromCuda;

void CudaGraphCache::Clear() {
  for (Entry& e : lru_) {
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  }
  lru_.clear();
  index_.clear();
}

absl::StatusOr<void*> CudaGraphCache::CaptureScratch(uint64_t bytes) {
  Entry& e = *capturing_;
  if (scratch_next_ < e.scratch.size() && e.scratch[scratch_next_]->bytes() >= bytes) {
    return e.scratch[scratch_next_++]->data();
  }
  ASSIGN_OR_RETURN(BufferPtr b, allocate_(bytes));
  if (scratch_next_ < e.scratch.size()) {
    e.scratch[scratch_next_] = std::move(b);  // its graph is not on the device (see the header)
  } else {
    e.scratch.push_back(std::move(b));
  }
  return e.scratch[scratch_next_++]->data();
}

absl::StatusOr<cudaGraph_t> CudaGraphCache::Capture(cudaStream_t stream, cudaStream_t lane_stream,
                                                   Entry& entry,
                                                   const std::function<absl::Status()>& launch) {
  // Relaxed: the launchers may ask the runtime things (attributes, driver entry points) that
  // the stricter modes refuse while a capture is open, and other lanes keep working meanwhile.
  RETURN_IF_ERROR(bind_(stream));
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    return static_cast<cudaGraph_t>(nullptr);
  }
  capturing_ = &entry;
  scratch_next_ = 0;
  const absl::Status launched = launch();
  capturing_ = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  RETURN_IF_ERROR(bind_(lane_stream));
  if (ended != cudaSuccess || graph == nullptr) {
    // A call the capture cannot hold (a synchronous copy, a wait) ended it: the launch's own
    // error, if any, came from that and says nothing about the request.
    (void)cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return static_cast<cudaGraph_t>(nullptr);
  }
  if (!launched.ok()) {
    cudaGraphDestroy(graph);
    return launched;
  }
  return graph;
}

CudaGraphCache::Entry& CudaGraphCache::Insert(Entry entry) {
  lru_.push_front(std::move(entry));
  index_[lru_.front().key] = lru_.begin();
  while (static_cast<int>(lru_.size()) > capacity_) {
    Entry& old = lru_.back();
    if (old.exec != nullptr) cudaGraphExecDestroy(old.exec);
    index_.erase(old.key);
    lru_.pop_back();
  }
  return lru_.front();
}

absl::StatusOr<GraphReplay> CudaGraphCache::Launch(cudaStream_t stream,
                                                   cudaStream_t capture_stream,
                                                   const std::string& key,
                                                   std::span<const void* const> bindings,
                                                   const std::function<absl::Status()>& launch,
                                                   CudaNodeTimer::Stamps& stamps) {
  auto run_directly = [&]() -> absl::StatusOr<GraphReplay> {
    RETURN_IF_ERROR(launch());
    return GraphReplay::kNotUsed;
  };
  if (capacity_ == 0) return run_directly();

  auto it = index_.find(key);
  if (it == index_.end()) {
    Entry fresh{.key = key};
    ASSIGN_OR_RETURN(cudaGraph_t graph, Capture(capture_stream, stream, fresh, launch));
    if (graph != nullptr) {
      if (cudaGraphInstantiate(&fresh.exec, graph, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        fresh.exec = nullptr;
      }
      cudaGraphDestroy(graph);
    }
    // An entry without a graph remembers that this signature cannot be captured.
    fresh.bindings.assign(bindings.begin(), bindings.end());
    fresh.stamps = stamps;
    Entry& e = Insert(std::move(fresh));
    if (e.exec == nullptr) return run_directly();
    RETURN_IF_ERROR(FromCuda(cudaGraphLaunch(e.exec, stream), "graph launch"));
    return GraphReplay::kCaptured;
  }

  lru_.splice(lru_.begin(), lru_, it->second);
  Entry& e = lru_.front();
  if (e.exec == nullptr) return run_directly();
  if (!std::equal(bindings.begin(), bindings.end(), e.bindings.begin(), e.bindings.end())) {
    // Other tensors: capture again and update the graph in place, which keeps its instance
    // (far cheaper than instantiating) when only kernel arguments changed.
    absl::StatusOr<cudaGraph_t> captured = Capture(capture_stream, stream, e, launch);
    if (!captured.ok()) {
      // The capture may have replaced some of the entry's scratch, which its graph still
      // points at: the entry goes, and the next request of its signature captures afresh.
      cudaGraphExecDestroy(e.exec);
      index_.erase(e.key);
      lru_.pop_front();
      return captured.status();
    }
    cudaGraph_t graph = *captured;
    if (graph == nullptr) {
      cudaGraphExecDestroy(e.exec);
      e.exec = nullptr;
      return run_directly();
    }
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(e.exec, graph, &info) != cudaSuccess) {
      (void)cudaGetLastError();
      cudaGraphExecDestroy(e.exec);
      e.exec = nullptr;
      if (cudaGraphInstantiate(&e.exec, graph, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        e.exec = nullptr;
      }
    }
    cudaGraphDestroy(graph);
    if (e.exec == nullptr) return run_directly();
    e.bindings.assign(bindings.begin(), bindings.end());
    e.stamps = stamps;
    RETURN_IF_ERROR(FromCuda(cudaGraphLaunch(e.exec, stream), "graph launch"));
    return GraphReplay::kRebound;
  }
  stamps = e.stamps;
  RETURN_IF_ERROR(FromCuda(cudaGraphLaunch(e.exec, stream), "graph launch"));
  return GraphReplay::kReplayed;
}

}  // namespace opserve
