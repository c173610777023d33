// The CUDA collectives: peer copies through the runtime, broadcasts through NCCL when it can be
// loaded. NCCL is found at run time (dlopen) rather than linked: it is a 200 MB library that a
// machine may keep outside the toolkit, or lack, and a server with one GPU never needs it.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/collectives.h"

#if OPSERVE_HAVE_NCCL_H
#include <nccl.h>
#else
// The few types this file passes to NCCL, as nccl.h defines them (its ABI has kept them since 2.0).
typedef struct ncclComm* ncclComm_t;
typedef enum { ncclSuccess = 0 } ncclResult_t;
typedef enum { ncclInt8 = 0 } ncclDataType_t;
#endif

namespace opserve {
namespace {

// The NCCL entry points Broadcast uses, looked up in the loaded library.
struct NcclApi {
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  const char* (*last_error)(ncclComm_t) = nullptr;  // NCCL 2.13 on; may stay null
  std::string name;                                 // "nccl 2.28.9"
};

constexpr const char* kNcclSoname = "libnccl.so.2";
constexpr const char* kNcclPathEnv = "OPSERVE_NCCL_LIBRARY";

template <typename T>
bool Sym(void* lib, const char* symbol, T* fn) {
  *fn = reinterpret_cast<T>(dlsym(lib, symbol));
  return *fn != nullptr;
}

// Loads NCCL: "libnccl.so.2" from the loader's path, else the file $OPSERVE_NCCL_LIBRARY names.
// The library stays loaded for the process: its proxy threads may outlive a communicator.
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

// The runtime keeps a thread's last error until it is read, and launch checks elsewhere read
// it (cudaPeekAtLastError): an error this file has handled must not surface there.
cudaError_t Handled(cudaError_t e) {
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

std::string CudaText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// Restores the calling thread's current device, which every call here changes.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() {
    if (Handled(cudaGetDevice(&saved_)) != cudaSuccess) saved_ = -1;
  }
  ~KeepCurrentDevice() {
    int now = -1;
    if (saved_ >= 0 && (Handled(cudaGetDevice(&now)) != cudaSuccess || now != saved_)) {
      Handled(cudaSetDevice(saved_));
    }
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int saved_ = -1;
};

class CudaCollectives final : public Collectives {
 public:
  CudaCollectives(std::vector<int> ordinals, bool allow_nccl);
  ~CudaCollectives() override;

  std::string name() const override {
    return nccl_ok_.load(std::memory_order_acquire) ? nccl_.name : "cuda peer copies";
  }
  absl::Status Copy(int dst_dev, void* dst, int src_dev, const void* src, uint64_t bytes) override;
  absl::Status Broadcast(int root, std::span<void* const> ptrs, uint64_t bytes) override;
  bool PeerAccess(int a, int b) const override {
    const int n = static_cast<int>(devices_.size());
    return a >= 0 && b >= 0 && a < n && b < n && links_[a][b].peer;
  }
  std::string Topology() const override;

 private:
  struct Device {
    int ordinal = 0;
    std::string name;             // "cuda:<ordinal>"
    cudaStream_t stream = nullptr;  // this object's own, non-blocking
    absl::Status ready;           // why the device cannot be used, if it cannot
  };
  struct Link {
    bool peer = false;
    int rank = -1;       // cudaDevP2PAttrPerformanceRank where peer access is on
    std::string note;    // why there is none, where that is not simply "the GPUs cannot"
  };

  absl::Status PeerBroadcast(int root, std::span<void* const> ptrs, uint64_t bytes);
  // With nccl_mu_ held.
  absl::Status InitNccl();
  absl::Status NcclBroadcast(int root, std::span<void* const> ptrs, uint64_t bytes);
  void DisableNccl(const absl::Status& why);
  std::string Describe(int root, std::span<void* const> ptrs, uint64_t bytes) const;

  std::vector<Device> devices_;
  std::vector<std::string> names_;
  std::vector<std::vector<Link>> links_;  // [from][to]

  NcclApi nccl_;
  // NCCL loaded, its communicators not failed; cleared once for good when they fail.
  std::atomic<bool> nccl_ok_{false};
  // A communicator is used by one broadcast at a time (NCCL's rule for a communicator).
  std::mutex nccl_mu_;
  std::vector<ncclComm_t> comms_;  // one per device once made, guarded by nccl_mu_
  bool comms_broken_ = false;      // guarded by nccl_mu_
};

CudaCollectives::CudaCollectives(std::vector<int> ordinals, bool allow_nccl) {
  KeepCurrentDevice keep;
  const size_t n = ordinals.size();
  for (int ordinal : ordinals) {
    Device d;
    d.ordinal = ordinal;
    d.name = absl::StrCat("cuda:", ordinal);
    if (cudaError_t e = Handled(cudaSetDevice(ordinal)); e != cudaSuccess) {
      d.ready = absl::UnavailableError(absl::StrCat(d.name, ": cudaSetDevice: ", CudaText(e)));
    } else if (e = Handled(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
               e != cudaSuccess) {
      d.stream = nullptr;
      d.ready = absl::UnavailableError(absl::StrCat(d.name, ": cudaStreamCreate: ", CudaText(e)));
    }
    names_.push_back(d.name);
    devices_.push_back(std::move(d));
  }
  links_.assign(n, std::vector<Link>(n));
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const Device& from = devices_[a];
      const Device& to = devices_[b];
      Link& link = links_[a][b];
      if (a == b || from.ordinal == to.ordinal || !from.ready.ok() || !to.ready.ok()) continue;
      int can = 0;
      if (cudaError_t e = Handled(cudaDeviceCanAccessPeer(&can, from.ordinal, to.ordinal));
          e != cudaSuccess) {
        link.note = absl::StrCat("cudaDeviceCanAccessPeer: ", CudaText(e));
        continue;
      }
      if (!can) continue;
      if (const char* off = std::getenv("OPSERVE_PEER_ACCESS"); off != nullptr && std::string(off) == "0") {
        link.note = "peer access off (OPSERVE_PEER_ACCESS=0): copies staged by the driver";
        continue;
      }
      // Peer access is per direction: from's context maps to's memory.
      cudaError_t e = Handled(cudaSetDevice(from.ordinal));
      if (e == cudaSuccess) e = Handled(cudaDeviceEnablePeerAccess(to.ordinal, 0));
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        link.note = absl::StrCat("cudaDeviceEnablePeerAccess: ", CudaText(e));
        continue;
      }
      // Peer access covers cudaMalloc'd memory only: the backends allocate from each device's
      // default memory pool, whose blocks another device reads directly only once the pool
      // grants it access (else cudaMemcpyPeer stages through the host at a tenth of the speed).
      cudaMemPool_t pool = nullptr;
      e = Handled(cudaDeviceGetDefaultMemPool(&pool, to.ordinal));
      if (e == cudaSuccess) {
        cudaMemAccessDesc access{};
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = from.ordinal;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        e = Handled(cudaMemPoolSetAccess(pool, &access, 1));
      }
      if (e != cudaSuccess) {
        link.note = absl::StrCat("cudaMemPoolSetAccess: ", CudaText(e));
        continue;
      }
      link.peer = true;
      if (Handled(cudaDeviceGetP2PAttribute(&link.rank, cudaDevP2PAttrPerformanceRank,
                                            from.ordinal, to.ordinal)) != cudaSuccess) {
        link.rank = -1;
      }
    }
  }
  if (!allow_nccl || n < 2) return;
  // NCCL must use no NVLink multicast (NVLS) unless the operator asked for it: a program that
  // uses multicast can put a shared host's GPUs out of service. Set before NCCL reads its
  // environment, and while the process is starting, before other threads read theirs.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  // ncclCommInitAll takes one rank per GPU.
  if (std::set<int>(ordinals.begin(), ordinals.end()).size() != n) return;
  absl::StatusOr<NcclApi> api = LoadNccl();
  if (!api.ok()) {
    std::fprintf(stderr, "opserve: NCCL unavailable (%s): broadcasts run as peer copies\n",
                 std::string(api.status().message()).c_str());
    return;
  }
  nccl_ = *std::move(api);
  nccl_ok_.store(true, std::memory_order_release);
}

CudaCollectives::~CudaCollectives() {
  KeepCurrentDevice keep;
  {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    for (size_t i = 0; i < comms_.size(); ++i) {
      Handled(cudaSetDevice(devices_[i].ordinal));
      // A communicator whose work failed may never finish: abort it rather than wait for it.
      if (comms_broken_) {
        nccl_.comm_abort(comms_[i]);
      } else {
        nccl_.comm_destroy(comms_[i]);
      }
    }
  }
  for (Device& d : devices_) {
    if (d.stream == nullptr) continue;
    Handled(cudaSetDevice(d.ordinal));
    Handled(cudaStreamSynchronize(d.stream));
    Handled(cudaStreamDestroy(d.stream));
  }
}

absl::Status CudaCollectives::Copy(int dst_dev, void* dst, int src_dev, const void* src,
                                   uint64_t bytes) {
  RETURN_IF_ERROR(collectives_internal::CheckCopy(names_, dst_dev, dst, src_dev, src, bytes));
  if (bytes == 0) return absl::OkStatus();
  const Device& to = devices_[dst_dev];
  const Device& from = devices_[src_dev];
  for (const Device* d : {&from, &to}) {
    if (!d->ready.ok()) {
      return absl::Status(d->ready.code(),
                          absl::StrFormat("copy of %d bytes from %s to %s: %s", bytes, from.name,
                                          to.name, d->ready.message()));
    }
  }
  auto failed = [&](const char* what, cudaError_t e) {
    return absl::InternalError(absl::StrFormat("copy of %d bytes from %s (%p) to %s (%p): %s: %s",
                                               bytes, from.name, src, to.name, dst, what,
                                               CudaText(e)));
  };
  KeepCurrentDevice keep;
  // On the destination's stream: the destination's copy engine pulls over the peer link.
  if (cudaError_t e = Handled(cudaSetDevice(to.ordinal)); e != cudaSuccess) {
    return failed("cudaSetDevice", e);
  }
  if (cudaError_t e = Handled(
          cudaMemcpyPeerAsync(dst, to.ordinal, src, from.ordinal, bytes, to.stream));
      e != cudaSuccess) {
    return failed("cudaMemcpyPeerAsync", e);
  }
  if (cudaError_t e = Handled(cudaStreamSynchronize(to.stream)); e != cudaSuccess) {
    return failed("cudaStreamSynchronize", e);
  }
  return absl::OkStatus();
}

std::string CudaCollectives::Describe(int root, std::span<void* const> ptrs,
                                      uint64_t bytes) const {
  std::vector<std::string> to;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (static_cast<int>(i) != root && ptrs[i] != nullptr) to.push_back(names_[i]);
  }
  return absl::StrFormat("broadcast of %d bytes from %s to %s", bytes, names_[root],
                         absl::StrJoin(to, ", "));
}

absl::Status CudaCollectives::Broadcast(int root, std::span<void* const> ptrs, uint64_t bytes) {
  RETURN_IF_ERROR(collectives_internal::CheckBroadcast(names_, root, ptrs, bytes));
  if (bytes == 0) return absl::OkStatus();
  bool every_device = true;
  bool any_target = false;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (static_cast<int>(i) != root && ptrs[i] == nullptr) {
      every_device = false;
      continue;
    }
    any_target = any_target || static_cast<int>(i) != root;
  }
  if (!any_target) return absl::OkStatus();
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const absl::Status& ready = devices_[i].ready;
    if ((static_cast<int>(i) == root || ptrs[i] != nullptr) && !ready.ok()) {
      return absl::Status(ready.code(),
                          absl::StrCat(Describe(root, ptrs, bytes), ": ", ready.message()));
    }
  }
  // NCCL's communicators span every device, so a broadcast that skips one runs as peer copies.
  if (every_device && nccl_ok_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    // Another broadcast may have given NCCL up while this one waited for the lock.
    if (nccl_ok_.load(std::memory_order_acquire)) {
      if (absl::Status s = InitNccl(); !s.ok()) {
        DisableNccl(s);
      } else {
        return NcclBroadcast(root, ptrs, bytes);
      }
    }
  }
  return PeerBroadcast(root, ptrs, bytes);
}

absl::Status CudaCollectives::PeerBroadcast(int root, std::span<void* const> ptrs,
                                            uint64_t bytes) {
  KeepCurrentDevice keep;
  const Device& from = devices_[root];
  absl::Status first;
  std::vector<size_t> issued;
  // Every destination pulls on its own stream, so the copies run at once on their copy engines.
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (static_cast<int>(i) == root || ptrs[i] == nullptr || ptrs[i] == ptrs[root]) continue;
    const Device& to = devices_[i];
    cudaError_t e = Handled(cudaSetDevice(to.ordinal));
    if (e == cudaSuccess) {
      e = Handled(cudaMemcpyPeerAsync(ptrs[i], to.ordinal, ptrs[root], from.ordinal, bytes,
                                      to.stream));
    }
    if (e != cudaSuccess) {
      if (first.ok()) {
        first = absl::InternalError(absl::StrFormat("%s: peer copy to %s (%p): %s",
                                                    Describe(root, ptrs, bytes), to.name, ptrs[i],
                                                    CudaText(e)));
      }
      continue;
    }
    issued.push_back(i);
  }
  // Wait for every copy that started, even after a failure: none may still be writing when the
  // caller gets its error back.
  for (size_t i : issued) {
    const Device& to = devices_[i];
    cudaError_t e = Handled(cudaSetDevice(to.ordinal));
    if (e == cudaSuccess) e = Handled(cudaStreamSynchronize(to.stream));
    if (e != cudaSuccess && first.ok()) {
      first = absl::InternalError(absl::StrFormat("%s: peer copy to %s (%p): %s",
                                                  Describe(root, ptrs, bytes), to.name, ptrs[i],
                                                  CudaText(e)));
    }
  }
  return first;
}

absl::Status CudaCollectives::InitNccl() {
  if (!comms_.empty()) return absl::OkStatus();
  KeepCurrentDevice keep;
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // set at creation already; never overrides
  std::vector<int> ordinals;
  for (const Device& d : devices_) ordinals.push_back(d.ordinal);
  std::vector<ncclComm_t> comms(devices_.size(), nullptr);
  const ncclResult_t r =
      nccl_.comm_init_all(comms.data(), static_cast<int>(comms.size()), ordinals.data());
  if (r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat(nccl_.name, ": ncclCommInitAll over ",
                                               absl::StrJoin(names_, ", "), ": ",
                                               nccl_.error_string(r)));
  }
  comms_ = std::move(comms);
  return absl::OkStatus();
}

void CudaCollectives::DisableNccl(const absl::Status& why) {
  std::fprintf(stderr, "opserve: NCCL disabled (%s): broadcasts run as peer copies\n",
               std::string(why.message()).c_str());
  nccl_ok_.store(false, std::memory_order_release);
}

absl::Status CudaCollectives::NcclBroadcast(int root, std::span<void* const> ptrs,
                                            uint64_t bytes) {
  KeepCurrentDevice keep;
  auto nccl_error = [&](const std::string& where, ncclResult_t r) {
    std::string text = absl::StrCat(Describe(root, ptrs, bytes), " over ", nccl_.name, ": ",
                                    where, ": ", nccl_.error_string(r));
    const char* last = nccl_.last_error != nullptr ? nccl_.last_error(nullptr) : nullptr;
    if (last != nullptr && *last != '\0') absl::StrAppend(&text, " (", last, ")");
    return absl::InternalError(text);
  };
  absl::Status first;
  // One thread drives every device: the calls must be one group, or the first would wait for
  // peers that are never called.
  if (ncclResult_t r = nccl_.group_start(); r != ncclSuccess) {
    return nccl_error("ncclGroupStart", r);
  }
  // No cudaSetDevice here: each communicator knows its device, and a rank skipped for a failed
  // cudaSetDevice would leave the others waiting for it.
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const Device& d = devices_[i];
    // In place: NCCL reads sendbuff on the root only.
    const ncclResult_t r = nccl_.broadcast(ptrs[i], ptrs[i], bytes, ncclInt8, root, comms_[i],
                                           d.stream);
    if (r != ncclSuccess && first.ok()) {
      first = nccl_error(absl::StrCat("ncclBroadcast on ", d.name), r);
    }
  }
  if (ncclResult_t r = nccl_.group_end(); r != ncclSuccess && first.ok()) {
    first = nccl_error("ncclGroupEnd", r);
  }
  for (const Device& d : devices_) {
    cudaError_t e = Handled(cudaSetDevice(d.ordinal));
    if (e == cudaSuccess) e = Handled(cudaStreamSynchronize(d.stream));
    if (e != cudaSuccess && first.ok()) {
      first = absl::InternalError(absl::StrCat(Describe(root, ptrs, bytes), " over ", nccl_.name,
                                               ": waiting on ", d.name, ": ", CudaText(e)));
    }
  }
  if (!first.ok()) {
    // A communicator whose work failed may hold the others up: later broadcasts copy instead.
    comms_broken_ = true;
    DisableNccl(first);
  }
  return first;
}

std::string CudaCollectives::Topology() const {
  std::string out;
  for (size_t a = 0; a < devices_.size(); ++a) {
    for (size_t b = 0; b < devices_.size(); ++b) {
      if (a == b) continue;
      const Device& from = devices_[a];
      const Device& to = devices_[b];
      const Link& link = links_[a][b];
      absl::StrAppend(&out, from.name, " -> ", to.name, ": ");
      if (!from.ready.ok() || !to.ready.ok()) {
        absl::StrAppend(&out, "unusable (", (from.ready.ok() ? to : from).ready.message(), ")\n");
      } else if (from.ordinal == to.ordinal) {
        absl::StrAppend(&out, "same device\n");
      } else if (link.peer) {
        absl::StrAppend(&out, "peer access");
        if (link.rank >= 0) absl::StrAppend(&out, " (performance rank ", link.rank, ")");
        absl::StrAppend(&out, "\n");
      } else {
        absl::StrAppend(&out, "no peer access, copies staged through the host",
                        link.note.empty() ? "" : absl::StrCat(" (", link.note, ")"), "\n");
      }
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Collectives> NewCudaCollectives(std::vector<int> ordinals, bool allow_nccl) {
  return std::make_unique<CudaCollectives>(std::move(ordinals), allow_nccl);
}

}  // namespace opserve
