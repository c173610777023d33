#include "server/engine/cuda_node_timer.h"

#include <algorithm>

#include "kernels/stream_marks.h"

namespace opserve {

CudaNodeTimer::~CudaNodeTimer() {
  for (auto& [a, b] : events_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  for (uint64_t* area : areas_) cudaFreeHost(area);
}

void CudaNodeTimer::Init(int nodes) {
  if (nodes > 0) Events(nodes - 1);
  BeginRequest(nodes);
}

void CudaNodeTimer::BeginRequest(int num_nodes) {
  stamps_.assign(num_nodes, {nullptr, nullptr});
  pending_ = nullptr;
  // A graph stamps each node's two boundaries at most.
  const int need = 2 * num_nodes;
  if (!use_stamps_ || need <= capacity_) return;
  const int grown = std::max({need, 2 * capacity_, 64});
  void* p = nullptr;
  if (cudaMallocHost(&p, grown * sizeof(uint64_t)) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; this request's graph records events instead
    return;
  }
  areas_.push_back(static_cast<uint64_t*>(p));
  capacity_ = grown;
}

void CudaNodeTimer::Mark(int i, bool end, cudaStream_t stream, cudaStream_t capture,
                         bool capturing) {
  if (static_cast<int>(stamps_.size()) <= i) stamps_.resize(i + 1, {nullptr, nullptr});
  if (!capturing || !use_stamps_ || next_stamp_ >= capacity_) {
    stamps_[i] = {nullptr, nullptr};
    auto& [start_event, end_event] = Events(i);
    if (capturing) {
      // A plain record would only order the capture: an external one becomes a node of the
      // graph and times the node on every replay.
      cudaEventRecordWithFlags(end ? end_event : start_event, capture, cudaEventRecordExternal);
    } else {
      cudaEventRecord(end ? end_event : start_event, stream);
    }
    return;
  }
  if (last_stamp_ == nullptr) {
    uint64_t* slot = areas_.back() + next_stamp_++;
    pending_ = slot;  // written by what is queued next (Flush, TakePending)
    last_stamp_ = slot;
  }
  (end ? stamps_[i].second : stamps_[i].first) = last_stamp_;
}

void CudaNodeTimer::Flush(cudaStream_t capture) {
  if (pending_ == nullptr) return;
  (void)kernels::LaunchTimestamp(pending_, capture);  // an error here fails the capture
  pending_ = nullptr;
}

std::vector<double> CudaNodeTimer::Seconds(int num_nodes) {
  std::vector<double> seconds(num_nodes, 0.0);
  for (int i = 0; i < num_nodes; ++i) {
    const auto [start, end] = i < static_cast<int>(stamps_.size())
                                  ? stamps_[i]
                                  : std::pair<const uint64_t*, const uint64_t*>{nullptr, nullptr};
    if (start != nullptr && end != nullptr) {
      seconds[i] = *end >= *start ? static_cast<double>(*end - *start) * 1e-9 : 0.0;
      continue;
    }
    if (i >= static_cast<int>(events_.size())) continue;
    float ms = 0.f;
    if (cudaEventElapsedTime(&ms, events_[i].first, events_[i].second) == cudaSuccess) {
      seconds[i] = ms * 1e-3;
    } else {
      // A pair this request did not record (a node it abandoned before marking): no time, and
      // the error must not stay behind to fail the next launch's error check.
      (void)cudaGetLastError();
    }
  }
  return seconds;
}

std::pair<cudaEvent_t, cudaEvent_t>& CudaNodeTimer::Events(int i) {
  while (static_cast<int>(events_.size()) <= i) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    events_.emplace_back(a, b);
  }
  return events_[i];
}

}  // namespace opserve
