// Shared-memory regions a client registers (Triton's shared-memory extensions): its POSIX shm
// objects, mapped into the server and registered with the device so that copies run at the host
// link's speed, and its CUDA device buffers, opened through CUDA IPC and read and written in
// place. Requests name a region, an offset and a byte size instead of carrying bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/rpc/tenant_map.h"

namespace opserve {

// A mapped POSIX shared-memory object: [offset, offset + byte_size) of `key`.
class SystemRegion {
 public:
  // Maps and registers; NOT_FOUND for a key no object has, INVALID_ARGUMENT for a range past
  // the object's end. A registration the device refuses (e.g. a locked-memory limit) leaves the
  // region mapped but pageable: slower copies, the same results.
  static absl::StatusOr<std::shared_ptr<SystemRegion>> Map(Backend& backend, std::string key,
                                                           uint64_t offset, uint64_t byte_size);
  ~SystemRegion();  // unregisters and unmaps: after the last request that uses it is done
  SystemRegion(const SystemRegion&) = delete;
  SystemRegion& operator=(const SystemRegion&) = delete;

  // [offset, offset + bytes) of the region (checked by CheckRegionRange) still lies inside its
  // object: a client can truncate the object after registering it, and touching a mapped page
  // past the object's end raises SIGBUS. Checked at each use.
  absl::Status CheckObjectCovers(absl::string_view region, uint64_t offset, uint64_t bytes) const;

  const std::string& key() const { return key_; }
  uint64_t offset() const { return offset_; }
  uint64_t byte_size() const { return byte_size_; }
  char* data() const { return data_; }  // the region's first byte

 private:
  SystemRegion(Backend& backend, std::string key, uint64_t offset, uint64_t byte_size)
      : backend_(backend), key_(std::move(key)), offset_(offset), byte_size_(byte_size) {}
  Backend& backend_;
  const std::string key_;
  const uint64_t offset_, byte_size_;
  int fd_ = -1;  // kept open for CheckObjectCovers
  void* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  char* data_ = nullptr;
  bool pinned_ = false;
};

// A client's device buffer on this server's GPU.
struct CudaRegion {
  int64_t device_id = 0;
  int engine_device = 0;  // the engine's index of that GPU: graphs that use the region run there
  uint64_t byte_size = 0;
  BufferPtr buffer;  // closed when the last reference goes
};

// At most this many regions of each kind per tenant.
inline constexpr size_t kMaxSharedMemoryRegions = 256;

struct SharedMemoryRegistry {
  TenantMap<SystemRegion> system{"system shared memory region", kMaxSharedMemoryRegions};
  TenantMap<CudaRegion> cuda{"CUDA shared memory region", kMaxSharedMemoryRegions};
};

// [offset, offset + bytes) of a region of `region_bytes` bytes, checked: INVALID_ARGUMENT names
// the region and both ends when the range runs past the region's end.
absl::Status CheckRegionRange(absl::string_view region, uint64_t region_bytes, uint64_t offset,
                              uint64_t bytes);


// Bytes [offset, offset + bytes) of `parent` (checked by the caller), as a Buffer that keeps
// `parent` alive: a tensor at an offset in a CUDA shared memory region.
BufferPtr SliceBuffer(BufferPtr parent, uint64_t offset, uint64_t bytes);

// [offset, offset + bytes) of the tenant's region `region`, checked and held for one use: the
// host bytes of a system region, or a slice of a CUDA region's device memory. NOT_FOUND when
// the tenant has no region of that name, INVALID_ARGUMENT for a range past its end.
struct RegionRange {
  std::shared_ptr<SystemRegion> system;
  std::shared_ptr<CudaRegion> cuda;
  char* host = nullptr;  // a system region's bytes
  BufferPtr device;      // a CUDA region's
  int device_index = -1;  // ... on this engine device
  const void* data() const { return host != nullptr ? static_cast<const void*>(host) : device->data(); }
  void* mutable_data() const { return host != nullptr ? static_cast<void*>(host) : device->data(); }
};
absl::StatusOr<RegionRange> ResolveRegion(SharedMemoryRegistry& regions, const std::string& tenant,
                                          const std::string& region, uint64_t offset,
                                          uint64_t bytes);

}  // namespace opserve
