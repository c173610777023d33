// How glibc's malloc treats the host memory that gRPC receives large messages into.
//
// gRPC reads a message into slices of up to a few MiB from malloc, and frees them once the
// message is parsed. With glibc's defaults that memory goes back to the kernel after every large
// request: a thread's arena unmaps a heap once it is empty, and the main arena trims its top past
// a threshold that follows the largest block freed. The next request faults every page in again,
// which costs more than the copy itself where page faults are slow: the GPU hosts first-touch
// fresh memory at 1.5-2.1 GB/s (client/TUNING.md), slower than gRPC moves bytes over loopback.
// PERFORMANCE.md ("The Open Inference Protocol") has raw_input_contents with and without the settings below.
//
// RetainFreedHostMemory(bytes) keeps freed memory mapped for reuse:
//  - top pad 64 MiB (M_TOP_PAD): a thread's arena keeps its heaps (64 MiB each) instead of
//    unmapping those that empty, and does not shrink them;
//  - trim threshold `bytes` (M_TRIM_THRESHOLD): the main arena gives back free memory at its top
//    only beyond that;
//  - mmap threshold fixed at 32 MiB (M_MMAP_THRESHOLD, glibc's largest): blocks above it are
//    mapped on their own and unmapped on free, as before, so one huge block is never kept.
// Threads keep their own arenas: one shared arena (M_ARENA_MAX 1) kept the memory too, but its
// lock cost small requests under load a quarter of their throughput (PERFORMANCE.md).
// Call it first thing in main, before the heaps grow. 0 leaves glibc's defaults. Sanitizer builds
// bring their own allocator and ignore it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace opserve {

// What the server's main arena keeps free at its top (--retain_freed_host_memory): four of the
// largest default messages.
inline constexpr uint64_t kRetainedTopBytes = uint64_t{1} << 30;

absl::Status RetainFreedHostMemory(uint64_t bytes);

}  // namespace opserve
