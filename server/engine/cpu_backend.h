// The CPU reference backend: host memory, reference kernels, host-clock timing.
#pragma once

#include <memory>

#include "server/engine/backend.h"

namespace opserve {

// `budget_bytes` 0 means half of physical memory.
std::unique_ptr<Backend> MakeCpuBackend(uint64_t budget_bytes);

}  // namespace opserve
