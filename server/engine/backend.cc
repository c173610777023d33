#include "server/engine/backend.h"

#include "absl/strings/str_cat.h"

namespace opserve {

absl::Status MemoryBudget::Reserve(uint64_t bytes) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > budget_ || used > budget_ - bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("memory budget exceeded: need ", bytes,
                                                       " bytes, ", used, " of ", budget_,
                                                       " in use (--memory_budget_bytes)"));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return absl::OkStatus();
}

}  // namespace opserve
