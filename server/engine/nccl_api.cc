#include "server/engine/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace opserve {
namespace {

constexpr const char* kNcclSoname = "libnccl.so.2";
constexpr const char* kNcclPathEnv = "OPSERVE_NCCL_LIBRARY";

template <typename T>
bool Sym(void* lib, const char* symbol, T* fn) {
  *fn = reinterpret_cast<T>(dlsym(lib, symbol));
  return *fn != nullptr;
}

}  // namespace

absl::StatusOr<NcclApi> LoadNccl() {
  std::vector<std::string> tried;
  void* lib = dlopen(kNcclSoname, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) tried.push_back(dlerror());
  const char* path = std::getenv(kNcclPathEnv);
  if (lib == nullptr && path != nullptr && *path != '\0') {
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) tried.push_back(absl::StrCat(kNcclPathEnv, "=", path, ": ", dlerror()));
  }
  if (lib == nullptr) {
    if (path == nullptr || *path == '\0') tried.push_back(absl::StrCat(kNcclPathEnv, " unset"));
    return absl::UnavailableError(absl::StrJoin(tried, "; "));
  }
  NcclApi api;
  const bool ok = Sym(lib, "ncclGetVersion", &api.get_version) &&
                  Sym(lib, "ncclCommInitAll", &api.comm_init_all) &&
                  Sym(lib, "ncclCommDestroy", &api.comm_destroy) &&
                  Sym(lib, "ncclCommAbort", &api.comm_abort) &&
                  Sym(lib, "ncclGroupStart", &api.group_start) &&
                  Sym(lib, "ncclGroupEnd", &api.group_end) &&
                  Sym(lib, "ncclBroadcast", &api.broadcast) &&
                  Sym(lib, "ncclGetErrorString", &api.error_string);
  if (!ok) return absl::UnavailableError(absl::StrCat("NCCL lacks a symbol: ", dlerror()));
  Sym(lib, "ncclGetLastError", &api.last_error);
  int version = 0;
  if (api.get_version(&version) != ncclSuccess) {
    return absl::UnavailableError("ncclGetVersion failed");
  }
  // NCCL_VERSION_CODE is major*10000 + minor*100 + patch from 2.9 on, major*1000 + ... before.
  const int major = version >= 20900 ? version / 10000 : version / 1000;
  const int minor = version >= 20900 ? version % 10000 / 100 : version % 1000 / 100;
  const int patch = version % 100;
  if (major != 2) {
    return absl::UnavailableError(absl::StrCat("NCCL version code ", version,
                                               " is not a 2.x this file was written against"));
  }
  api.name = absl::StrCat("nccl ", major, ".", minor, ".", patch);
  return api;
}

}  // namespace opserve
