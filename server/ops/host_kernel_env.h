// A KernelEnv for running CPU rows outside a server (the bench's table cases, the op-table tool):
// scratch is host memory, held until the env goes. No stream and no BLAS handle.
#pragma once

#include <cstdint>
#include <vector>

#include "server/ops/op.h"

namespace opserve {

class HostKernelEnv final : public KernelEnv {
 public:
  absl::StatusOr<void*> Scratch(uint64_t bytes) override {
    blocks_.emplace_back(bytes);
    return static_cast<void*>(blocks_.back().data());
  }

 private:
  std::vector<std::vector<char>> blocks_;
};

}  // namespace opserve
