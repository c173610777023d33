// How a CUDA execution context times each node of a request on the device's clock.
//
// Launched node by node, a node sits between two CUDA events on the lane's stream. Inside a
// CUDA graph, events would be external event record nodes, which cost the device about 2.8 us
// each and the graph launch about 1.5 us more on the host; there the node boundaries are
// timestamp kernels instead (kernels/stream_marks.h), one per boundary: a node's end is the next
// node's start, and a boundary with nothing queued since the last one reuses its stamp. A stamp
// is written by whatever is queued next: a timestamp kernel (Flush), or the kernel that copies
// an output to the host (TakePending), which saves the graph a kernel. The stamps land in
// page-locked memory that the host reads after the request's wait.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace opserve {

class CudaNodeTimer {
 public:
  // Where each node's boundaries were stamped, for the graph that stamped them: a replay
  // writes the same places, so the graph cache keeps this beside the graph and restores it.
  // {nullptr, nullptr}: the node was timed by events.
  using Stamps = std::vector<std::pair<const uint64_t*, const uint64_t*>>;

  // `use_stamps`: false where the device's timer is too coarse; graphs then record events.
  explicit CudaNodeTimer(bool use_stamps) : use_stamps_(use_stamps) {}
  ~CudaNodeTimer();
  CudaNodeTimer(const CudaNodeTimer&) = delete;
  CudaNodeTimer& operator=(const CudaNodeTimer&) = delete;

  // Events and stamps for `nodes` nodes, made ahead of the first requests.
  void Init(int nodes);
  // A request of `num_nodes` nodes starts: room for its stamps (where page-locked memory is
  // short, its graph records events instead), none marked yet.
  void BeginRequest(int num_nodes);
  // A capture starts: its stamps are written from the first place on. Graphs of one context
  // never run at once, so they can share the places.
  void BeginCapture() {
    next_stamp_ = 0;
    last_stamp_ = nullptr;
    pending_ = nullptr;
  }
  // Before work is queued on the capture stream: the last boundary's stamp, if nothing has
  // written it yet, is written now by a timestamp kernel. Also at the end of a capture.
  void Flush(cudaStream_t capture);
  // The last boundary's stamp, if nothing has written it yet, for the kernel queued next to
  // write (the caller then calls Queued); nullptr if there is none.
  uint64_t* TakePending() {
    uint64_t* p = pending_;
    pending_ = nullptr;
    return p;
  }
  // Work was queued on the capture stream since the last boundary.
  void Queued() { last_stamp_ = nullptr; }
  // Node `i`'s start or end: an event on `stream`, or while capturing a stamp on `capture`.
  void Mark(int i, bool end, cudaStream_t stream, cudaStream_t capture, bool capturing);
  // Node `i`'s end event (node-by-node launches only).
  cudaEvent_t EndEvent(int i) { return Events(i).second; }
  // After the request's wait: each node's seconds.
  std::vector<double> Seconds(int num_nodes);
  Stamps& stamps() { return stamps_; }

 private:
  std::pair<cudaEvent_t, cudaEvent_t>& Events(int i);

  const bool use_stamps_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  Stamps stamps_;  // this request's, one per node
  // Page-locked stamp areas: the current one, and smaller ones that graphs made before it grew
  // still write to.
  std::vector<uint64_t*> areas_;
  int capacity_ = 0;  // stamps in areas_.back()
  int next_stamp_ = 0;
  const uint64_t* last_stamp_ = nullptr;  // the boundary nothing has been queued after
  uint64_t* pending_ = nullptr;           // its stamp, when nothing is queued to write it yet
};

}  // namespace opserve
