// Small kernels the engine queues around a request's nodes inside a CUDA graph, where they cost
// the device far less than the nodes they replace: an external event record node leaves a gap
// of about 2.8 us on the device, a timestamp kernel 1.4 us, and a device-to-host copy node of a
// few bytes brings the graph's end about 3 us later than a copy kernel (measured on an H200 by
// bench/diag/graph_marks.cu; docs/performance/history.md).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

// Writes the device's global nanosecond timer (%globaltimer) to `dst`, once the work queued
// before it on `stream` is done. `dst` may be page-locked host memory.
cudaError_t LaunchTimestamp(uint64_t* dst, cudaStream_t stream);

// Copies `bytes` from device memory to page-locked host memory with a kernel, not the copy
// engine: for a few kilobytes the kernel is done before a copy node would start. With `stamp`,
// the kernel first writes the timer there as LaunchTimestamp would at the same place in the
// stream, which saves a graph the timestamp kernel before its copy (0.6-0.8 us of device time).
cudaError_t LaunchCopyToHost(const void* src, void* dst, uint64_t bytes, cudaStream_t stream,
                             uint64_t* stamp = nullptr);

// The timer's smallest step in nanoseconds, measured on `stream` (blocking; for start-up). Some
// GPUs advance it only every microsecond, too coarse to time a kernel of a few.
cudaError_t MeasureTimerStep(uint64_t* step_ns, cudaStream_t stream);

}  // namespace opserve::kernels
