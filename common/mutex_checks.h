// What opserve's programs do first about Abseil's mutexes, which gRPC uses for every call.
#pragma once

#include "absl/synchronization/mutex.h"

namespace opserve {

// Debian's Abseil is built with its mutex deadlock detection on: every lock of an absl::Mutex
// then takes one process-wide spinlock to update a graph of the locks each thread holds, and a
// server or client with many threads in gRPC shares that lock. Off, Abseil behaves as in a
// release build. Call before any threads start.
inline void SkipMutexDeadlockChecks() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace opserve
