#include "server/engine/tensor_store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace opserve {

constexpr size_t kMaxNameBytes = 256;

absl::Status CheckTensorName(const std::string& name, absl::string_view what) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a tensor name needs 1 to ",
                                                   kMaxNameBytes, " bytes, got ", name.size()));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor name ", Quote(name),
                       " may only hold letters, digits and _ . : / -"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredTensorPtr> TensorStore::Get(const std::string& name,
                                                 const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find({tenant, name});
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", Quote(name), kNotStoredHere));
  }
  return it->second;
}

std::vector<StoredTensorPtr> TensorStore::ListAll() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StoredTensorPtr> out;
  out.reserve(tensors_.size());
  for (const auto& [key, t] : tensors_) out.push_back(t);
  return out;
}

absl::Status TensorStore::Replace(const StoredTensorPtr& expected, StoredTensorPtr replacement,
                                  const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find({tenant, expected->name});
  if (it == tensors_.end() || it->second != expected) {
    return absl::AbortedError(absl::StrCat("tensor ", Quote(expected->name),
                                           " was deleted or overwritten while it moved; try again"));
  }
  it->second = std::move(replacement);
  return absl::OkStatus();
}

absl::Status TensorStore::CheckFreeLocked(const Key& key, bool overwrite) const {
  if (!overwrite && tensors_.count(key) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("tensor ", Quote(key.second), " already exists; set overwrite to replace it"));
  }
  return absl::OkStatus();
}

absl::Status TensorStore::CheckFree(const std::string& name, bool overwrite,
                                    const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckFreeLocked({tenant, name}, overwrite);
}

absl::Status TensorStore::InsertAll(std::vector<StoredTensorPtr> tensors,
                                    std::vector<bool> overwrite, const std::string& tenant,
                                    const std::function<absl::Status()>& still_wanted) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (auto s = CheckFreeLocked({tenant, tensors[i]->name}, overwrite[i]); !s.ok()) return s;
  }
  if (still_wanted) {
    if (auto s = still_wanted(); !s.ok()) return s;
  }
  for (auto& t : tensors) tensors_[{tenant, t->name}] = std::move(t);
  return absl::OkStatus();
}

absl::StatusOr<StoredTensorPtr> TensorStore::Erase(const std::string& name,
                                                   const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find({tenant, name});
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", Quote(name), kNotStoredHere));
  }
  StoredTensorPtr t = std::move(it->second);
  tensors_.erase(it);
  return t;
}

std::vector<StoredTensorPtr> TensorStore::List(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StoredTensorPtr> out;
  for (auto it = tensors_.lower_bound({tenant, ""}); it != tensors_.end() && it->first.first == tenant; ++it) {
    out.push_back(it->second);
  }
  return out;
}

size_t TensorStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_.size();
}

}  // namespace opserve
