// --device: which devices the server runs on, and their backends. "cpu", "cpu:N" (N CPU
// reference devices), "cuda" (every visible GPU), "cuda:I[,J...]" (a list) or "auto" (every GPU
// if one is usable, else "cpu").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"

namespace opserve {

// The most devices one process serves (--device=cpu:N, cuda:I,J...): more than any node has.
inline constexpr int kMaxDevices = 64;

struct DeviceFlag {
  bool cpu = false;
  int cpu_devices = 0;    // "cpu:N"; 0 for plain "cpu"
  bool all_cuda = false;  // "cuda", "auto"
  bool fall_back = false;  // "auto"
  std::vector<int> cuda;  // "cuda:I,J"
};

// INVALID_ARGUMENT naming the flag's value when it is none of the forms above.
absl::StatusOr<DeviceFlag> ParseDeviceFlag(const std::string& flag);

// The backends of --device=`device`, each with `budget` bytes of device memory, capped at
// `max_compute_capability` (major * 10 + minor; 0: none) and keeping `graph_cache` CUDA graphs
// per execution context. "auto" falls back to the CPU when no GPU is usable. Logs which backend
// and devices were chosen and why: the server's first lines.
absl::StatusOr<std::vector<std::unique_ptr<Backend>>> ChooseBackends(const std::string& device,
                                                                     uint64_t budget,
                                                                     int max_compute_capability,
                                                                     int graph_cache);

}  // namespace opserve
