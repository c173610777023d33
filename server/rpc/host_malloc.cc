#include "server/rpc/host_malloc.h"

#include <malloc.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace opserve {

absl::Status RetainFreedHostMemory(uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  // mallopt takes an int; a threshold past 2 GiB means "never trim" here.
  const int trim = static_cast<int>(std::min<uint64_t>(bytes, std::numeric_limits<int>::max()));
  constexpr int kMmapThreshold = 32 << 20;
  // At least a thread heap's size (64 MiB, twice glibc's largest mmap threshold): glibc then
  // neither unmaps an empty heap of a thread's arena nor shrinks one.
  constexpr int kTopPad = 2 * kMmapThreshold;
  if (mallopt(M_TRIM_THRESHOLD, trim) != 1 || mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 ||
      mallopt(M_TOP_PAD, kTopPad) != 1) {
    return absl::InternalError(absl::StrCat("mallopt refused a setting for retaining ", bytes,
                                            " bytes of freed host memory"));
  }
  return absl::OkStatus();
}

}  // namespace opserve
