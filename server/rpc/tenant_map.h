// Named objects a client registers and later refers to by name: saved graphs and shared-memory
// regions. Each tenant (one per auth token; "" without auth) has its own names, and at most
// `max_per_tenant` of them: past that, RESOURCE_EXHAUSTED. Objects are shared: a request that
// found one keeps it alive (and, for a region, mapped) after it is erased.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/ops/tensor.h"

namespace opserve {

template <typename T>
class TenantMap {
 public:
  using Ptr = std::shared_ptr<T>;

  // `kind` names the objects in messages: "saved graph", "system shared memory region".
  TenantMap(std::string kind, size_t max_per_tenant)
      : kind_(std::move(kind)), max_per_tenant_(max_per_tenant) {}

  // ALREADY_EXISTS for a taken name unless `overwrite`.
  absl::Status Insert(const std::string& tenant, const std::string& name, Ptr value,
                      bool overwrite = false) {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{tenant, name};
    auto it = map_.find(key);
    if (it != map_.end()) {
      if (!overwrite) return absl::AlreadyExistsError(absl::StrCat(kind_, " ", Quote(name), " already exists"));
      it->second = std::move(value);
      return absl::OkStatus();
    }
    if (CountLocked(tenant) >= max_per_tenant_) {
      return absl::ResourceExhaustedError(absl::StrCat("already ", max_per_tenant_, " ", kind_,
                                                       "s registered; unregister one first"));
    }
    map_.emplace(key, std::move(value));
    return absl::OkStatus();
  }

  absl::StatusOr<Ptr> Find(const std::string& tenant, const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(Key{tenant, name});
    if (it == map_.end()) return absl::NotFoundError(absl::StrCat("no ", kind_, " ", Quote(name)));
    return it->second;
  }

  // Erases `name`, or every object of the tenant when `name` is empty. `may_erase`, asked under
  // the lock for each, can refuse (e.g. a region still in use): then nothing is erased.
  absl::StatusOr<std::vector<Ptr>> Erase(
      const std::string& tenant, const std::string& name,
      const std::function<absl::Status(const std::string&, const Ptr&)>& may_erase = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<typename Map::iterator> doomed;
    if (name.empty()) {
      for (auto it = map_.lower_bound(Key{tenant, ""}); it != map_.end() && it->first.first == tenant;
           ++it) {
        doomed.push_back(it);
      }
    } else {
      auto it = map_.find(Key{tenant, name});
      if (it == map_.end()) return absl::NotFoundError(absl::StrCat("no ", kind_, " ", Quote(name)));
      doomed.push_back(it);
    }
    if (may_erase) {
      for (auto it : doomed) {
        if (absl::Status s = may_erase(it->first.second, it->second); !s.ok()) return s;
      }
    }
    std::vector<Ptr> erased;
    for (auto it : doomed) {
      erased.push_back(std::move(it->second));
      map_.erase(it);
    }
    return erased;
  }

  // (name, object) of the tenant, by name; only `name` when it is not empty (none if absent).
  std::vector<std::pair<std::string, Ptr>> List(const std::string& tenant,
                                                const std::string& name = "") const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, Ptr>> out;
    for (auto it = map_.lower_bound(Key{tenant, ""}); it != map_.end() && it->first.first == tenant;
         ++it) {
      if (name.empty() || it->first.second == name) out.emplace_back(it->first.second, it->second);
    }
    return out;
  }

 private:
  using Key = std::pair<std::string, std::string>;  // (tenant, name)
  using Map = std::map<Key, Ptr>;

  size_t CountLocked(const std::string& tenant) const {
    size_t n = 0;
    for (auto it = map_.lower_bound(Key{tenant, ""}); it != map_.end() && it->first.first == tenant;
         ++it) {
      ++n;
    }
    return n;
  }

  const std::string kind_;
  const size_t max_per_tenant_;
  mutable std::mutex mu_;
  Map map_;
};

}  // namespace opserve
