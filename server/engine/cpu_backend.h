// The CPU reference backend: host memory, reference kernels, host-clock timing.
#pragma once

#include <memory>

#include "server/engine/backend.h"

namespace opserve {

#include <string>

// One CPU reference device named `device` ("cpu", or "cpu:1" of several). `budget_bytes` 0 means
// half of physical memory, split evenly over the `devices_on_host` CPU devices of the process.
std::unique_ptr<Backend> MakeCpuBackend(uint64_t budget_bytes, std::string device = "cpu",
                                        int devices_on_host = 1);

}  // namespace opserve
