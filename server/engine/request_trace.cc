#include "server/engine/request_trace.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace opserve {

RequestTrace::Record* RequestTrace::Add(absl::string_view rpc) {
  const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i >= records_.size()) return nullptr;
  records_[i].rpc_ = rpc;
  return &records_[i];
}

absl::Status RequestTrace::WriteCsv(const std::string& path) const {
  std::ofstream csv(path);
  if (!csv) return absl::UnavailableError(absl::StrCat("cannot write the request trace to ", path));
  csv << "rpc";
  for (const char* name : kStageNames) csv << "," << name << "_ns";
  csv << "\n";
  const size_t n = std::min(next_.load(), records_.size());
  for (size_t i = 0; i < n; ++i) {
    csv << records_[i].rpc_;
    for (int64_t ns : records_[i].ns_) csv << "," << ns;
    csv << "\n";
  }
  csv.close();
  if (!csv) return absl::DataLossError(absl::StrCat("writing the request trace to ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace opserve
