#include "server/engine/collectives.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace opserve {
namespace collectives_internal {
namespace {

bool InRange(const std::vector<std::string>& names, int dev) {
  return dev >= 0 && static_cast<size_t>(dev) < names.size();
}

std::string DeviceList(const std::vector<std::string>& names) {
  return names.empty() ? std::string("none") : absl::StrJoin(names, ", ");
}

}  // namespace

absl::Status CheckCopy(const std::vector<std::string>& names, int dst_dev, const void* dst,
                       int src_dev, const void* src, uint64_t bytes) {
  for (const auto& [what, dev] :
       {std::pair{"destination", dst_dev}, std::pair{"source", src_dev}}) {
    if (!InRange(names, dev)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copy of %d bytes: %s device %d is not one of the %d devices (%s)", bytes, what, dev,
          names.size(), DeviceList(names)));
    }
  }
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "copy of %d bytes from %s (%p) to %s (%p): null pointer", bytes, names[src_dev], src,
        names[dst_dev], dst));
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcast(const std::vector<std::string>& names, int root,
                            std::span<void* const> ptrs, uint64_t bytes) {
  if (ptrs.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast of %d bytes: %d pointers given for %d devices (%s)", bytes, ptrs.size(),
        names.size(), DeviceList(names)));
  }
  if (!InRange(names, root)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast of %d bytes: root %d is not one of the %d devices (%s)", bytes, root,
        names.size(), DeviceList(names)));
  }
  if (bytes > 0 && ptrs[root] == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast of %d bytes: the root's pointer (on %s) is null", bytes, names[root]));
  }
  return absl::OkStatus();
}

}  // namespace collectives_internal

namespace {

// The CPU backend's devices share one address space: every copy is a memcpy.
class HostCollectives final : public Collectives {
 public:
  explicit HostCollectives(int n) {
    for (int i = 0; i < n; ++i) names_.push_back(absl::StrCat("cpu:", i));
  }

  std::string name() const override { return "host copies"; }

  absl::Status Copy(int dst_dev, void* dst, int src_dev, const void* src, uint64_t bytes) override {
    RETURN_IF_ERROR(collectives_internal::CheckCopy(names_, dst_dev, dst, src_dev, src, bytes));
    // memmove: a copy within one device may be handed overlapping ranges.
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status Broadcast(int root, std::span<void* const> ptrs, uint64_t bytes) override {
    RETURN_IF_ERROR(collectives_internal::CheckBroadcast(names_, root, ptrs, bytes));
    if (bytes == 0) return absl::OkStatus();
    for (size_t i = 0; i < ptrs.size(); ++i) {
      if (static_cast<int>(i) == root || ptrs[i] == nullptr || ptrs[i] == ptrs[root]) continue;
      std::memmove(ptrs[i], ptrs[root], bytes);
    }
    return absl::OkStatus();
  }

  bool PeerAccess(int a, int b) const override {
    const int n = static_cast<int>(names_.size());
    return a != b && a >= 0 && b >= 0 && a < n && b < n;
  }

  std::string Topology() const override {
    std::string out;
    for (size_t a = 0; a < names_.size(); ++a) {
      for (size_t b = 0; b < names_.size(); ++b) {
        if (a != b) absl::StrAppend(&out, names_[a], " -> ", names_[b], ": host memory (memcpy)\n");
      }
    }
    return out;
  }

 private:
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<Collectives> NewHostCollectives(int n) {
  return std::make_unique<HostCollectives>(n < 0 ? 0 : n);
}

}  // namespace opserve
