// A memcpy that survives its source or destination being a file mapping whose file shrank under
// it. A client may truncate the POSIX shm object behind a registered region between the
// server's size check and the copy (docs/SECURITY.md, item 11); touching a mapped page past the
// file's new end raises SIGBUS, which would end the process. Inside GuardedCopy a SIGBUS handler
// turns that fault into an error return for the copying thread instead. A SIGBUS anywhere else
// goes where it would have gone without the handler.
//
// The CPU backend copies through it. The CUDA backend needs no guard: a region there is
// page-locked (cudaHostRegister), and the device copies the locked pages, which truncating the
// file cannot take away.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace opserve {

// INVALID_ARGUMENT when the copy faulted on memory that went away (the destination then holds
// any mix of old and new bytes); OK otherwise.
absl::Status GuardedCopy(void* dst, const void* src, size_t bytes);

}  // namespace opserve
