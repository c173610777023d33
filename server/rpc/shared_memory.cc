#include "server/rpc/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace opserve {

absl::StatusOr<std::shared_ptr<SystemRegion>> SystemRegion::Map(Backend& backend, std::string key,
                                                                uint64_t offset,
                                                                uint64_t byte_size) {
  if (key.empty()) return absl::InvalidArgumentError("the shared memory key is empty");
  if (byte_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory key ", Quote(key),
                                                   ": byte_size is 0"));
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no shared memory object has the key ", Quote(key)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory key ", Quote(key), ": shm_open: ", std::strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of shared memory ", Quote(key), ": ",
                                            std::strerror(err)));
  }
  const uint64_t object_bytes = static_cast<uint64_t>(st.st_size);
  if (offset > object_bytes || byte_size > object_bytes - offset) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory key ", Quote(key), ": offset ", offset, " + byte_size ", byte_size,
        " runs past the object's end (", object_bytes, " bytes)"));
  }
  // mmap takes a page-aligned offset: map from the page that holds the region's first byte.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t map_offset = offset / page * page;
  std::shared_ptr<SystemRegion> region(new SystemRegion(backend, std::move(key), offset, byte_size));
  region->map_bytes_ = offset - map_offset + byte_size;
  void* map = mmap(nullptr, region->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(map_offset));
  const int err = errno;
  region->fd_ = fd;
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of shared memory ", Quote(region->key_), ": ", std::strerror(err)));
  }
  region->map_ = map;
  region->data_ = static_cast<char*>(map) + (offset - map_offset);
  // On the GPU the device copies the page-locked pages, which a client truncating the object
  // cannot take away; a pageable region would be copied by the driver on the CPU, where a
  // truncation faults (SIGBUS) inside it. So a region the device cannot lock is refused.
  absl::Status pinned = backend.RegisterHostMemory(map, region->map_bytes_);
  region->pinned_ = pinned.ok();
  if (!pinned.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("shared memory ", Quote(region->key_),
                                                     ": cannot page-lock it: ", pinned.message()));
  }
  return region;
}

SystemRegion::~SystemRegion() {
  if (pinned_) backend_.UnregisterHostMemory(map_);
  if (map_ != nullptr) munmap(map_, map_bytes_);
  if (fd_ >= 0) close(fd_);
}

absl::Status SystemRegion::CheckObjectCovers(absl::string_view region, uint64_t offset,
                                             uint64_t bytes) const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of shared memory ", Quote(key_), ": ",
                                            std::strerror(errno)));
  }
  const uint64_t end = offset_ + offset + bytes;
  if (end > static_cast<uint64_t>(st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory region ", Quote(region), ": its object ", Quote(key_), " now has ",
        st.st_size, " bytes, and offset ", offset, " + byte_size ", bytes,
        " ends past them (at byte ", end, " of the object); was it truncated after registering?"));
  }
  return absl::OkStatus();
}

absl::Status CheckRegionRange(absl::string_view region, uint64_t region_bytes, uint64_t offset,
                              uint64_t bytes) {
  if (offset > region_bytes || bytes > region_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory region ", Quote(region), ": offset ", offset, " + byte_size ", bytes,
        " runs past the region's end (", region_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

namespace {

class SliceOf final : public Buffer {
 public:
  SliceOf(BufferPtr parent, uint64_t offset, uint64_t bytes)
      : Buffer(static_cast<char*>(parent->data()) + offset, bytes), parent_(std::move(parent)) {}

 private:
  BufferPtr parent_;
};

}  // namespace

BufferPtr SliceBuffer(BufferPtr parent, uint64_t offset, uint64_t bytes) {
  return std::make_shared<SliceOf>(std::move(parent), offset, bytes);
}

absl::StatusOr<RegionRange> ResolveRegion(SharedMemoryRegistry& regions, const std::string& tenant,
                                          const std::string& region, uint64_t offset,
                                          uint64_t bytes) {
  RegionRange r;
  if (auto sys = regions.system.Find(tenant, region); sys.ok()) {
    if (absl::Status s = CheckRegionRange(region, (*sys)->byte_size(), offset, bytes); !s.ok()) return s;
    if (absl::Status s = (*sys)->CheckObjectCovers(region, offset, bytes); !s.ok()) return s;
    r.system = *std::move(sys);
    r.host = r.system->data() + offset;
    return r;
  }
  auto cuda = regions.cuda.Find(tenant, region);
  if (!cuda.ok()) {
    return absl::NotFoundError(absl::StrCat("no shared memory region ", Quote(region),
                                            " (system or CUDA) is registered"));
  }
  if (absl::Status s = CheckRegionRange(region, (*cuda)->byte_size, offset, bytes); !s.ok()) return s;
  r.cuda = *std::move(cuda);
  r.device = SliceBuffer(r.cuda->buffer, offset, bytes);
  r.device_index = r.cuda->engine_device;
  return r;
}

}  // namespace opserve
