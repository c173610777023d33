#include "server/http/civetweb_openssl.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace opserve::http {
namespace shim {
// openssl_shims_embedded.cc, written at build time from openssl_shim/*.cc.
extern const unsigned char opserve_ssl_shim[];
extern const unsigned long opserve_ssl_shim_size;
extern const unsigned char opserve_crypto_shim[];
extern const unsigned long opserve_crypto_shim_size;
}  // namespace shim

namespace {

// Maps `bytes` as a shared object named `soname` for the loader; the handle is kept for the
// process's life, as civetweb keeps its own. The memfd stays open in *fd: the loader knows the
// object by its path too, and a second memfd given the same number would be taken for it.
absl::Status LoadFromMemory(const char* soname, const unsigned char* bytes, unsigned long size,
                            int* fd_out) {
  const int fd = memfd_create(soname, MFD_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("memfd_create for ", soname, ": ", std::strerror(errno)));
  }
  for (unsigned long done = 0; done < size;) {
    const ssize_t n = write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("writing ", soname, " to its memfd: ", std::strerror(err)));
    }
    done += static_cast<unsigned long>(n);
  }
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  const char* error = handle == nullptr ? dlerror() : nullptr;
  *fd_out = fd;
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "loading ", soname, " from memory: ", error != nullptr ? error : "unknown error"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadOpenSslForCivetweb() {
  static const absl::Status status = [] {
    int fds[2] = {-1, -1};
    absl::Status s = LoadFromMemory("libcrypto.so", shim::opserve_crypto_shim,
                                    shim::opserve_crypto_shim_size, &fds[0]);
    if (s.ok()) {
      s = LoadFromMemory("libssl.so", shim::opserve_ssl_shim, shim::opserve_ssl_shim_size,
                         &fds[1]);
    }
    for (int fd : fds) {
      if (fd >= 0) close(fd);  // the mappings stay
    }
    return s;
  }();
  return status;
}

}  // namespace opserve::http
