// The CUDA collectives: peer copies through the runtime, broadcasts through NCCL when it can be
// loaded. NCCL is found at run time (dlopen) rather than linked: it is a 200 MB library that a
// machine may keep outside the toolkit, or lack, and a server with one GPU never needs it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/cuda_collectives_internal.h"

namespace opserve::cuda_collectives_internal {

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

absl::Status CudaCollectives::CheckReady(int root, std::span<void* const> ptrs, uint64_t bytes,
                                         bool* every_device, bool* any_target) const {
  RETURN_IF_ERROR(collectives_internal::CheckBroadcast(names_, root, ptrs, bytes));
  *every_device = true;
  *any_target = false;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (static_cast<int>(i) != root && ptrs[i] == nullptr) {
      *every_device = false;
      continue;
    }
    *any_target = *any_target || (static_cast<int>(i) != root && bytes > 0);
  }
  if (!*any_target) return absl::OkStatus();
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const absl::Status& ready = devices_[i].ready;
    if ((static_cast<int>(i) == root || ptrs[i] != nullptr) && !ready.ok()) {
      return absl::Status(ready.code(),
                          absl::StrCat(Describe(root, ptrs, bytes), ": ", ready.message()));
    }
  }
  return absl::OkStatus();
}

bool CudaCollectives::UseNccl(bool every_device, std::unique_lock<std::mutex>* lock) {
  // NCCL's communicators span every device, so a broadcast that skips one runs as peer copies.
  if (!every_device || !nccl_ok_.load(std::memory_order_acquire)) return false;
  *lock = std::unique_lock<std::mutex>(nccl_mu_);
  // Another broadcast may have given NCCL up while this one waited for the lock.
  if (nccl_ok_.load(std::memory_order_acquire)) {
    absl::Status s = InitNccl();
    if (s.ok()) return true;
    DisableNccl(s);
  }
  lock->unlock();
  return false;
}

absl::Status CudaCollectives::Broadcast(int root, std::span<void* const> ptrs, uint64_t bytes) {
  bool every_device = false, any_target = false;
  RETURN_IF_ERROR(CheckReady(root, ptrs, bytes, &every_device, &any_target));
  if (!any_target) return absl::OkStatus();
  std::unique_lock<std::mutex> lock;
  if (UseNccl(every_device, &lock)) return NcclBroadcast(root, ptrs, bytes);
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

}  // namespace opserve::cuda_collectives_internal

namespace opserve {

std::unique_ptr<Collectives> NewCudaCollectives(std::vector<int> ordinals, bool allow_nccl) {
  return std::make_unique<cuda_collectives_internal::CudaCollectives>(std::move(ordinals),
                                                                     allow_nccl);
}

}  // namespace opserve
