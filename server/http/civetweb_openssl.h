// HTTPS through civetweb on OpenSSL 3. civetweb loads OpenSSL itself, by dlopen("libssl.so") and
// dlopen("libcrypto.so"), and looks its functions up by their OpenSSL 1.1 names; Debian 12's
// civetweb 1.15 asks for SSL_get_peer_certificate, which OpenSSL 3 has only as a macro, so it
// finds no TLS. Here two small objects are loaded first whose sonames are the names civetweb
// opens (the dynamic loader answers a dlopen by name with an object already loaded under that
// soname): one defines that function over SSL_get1_peer_certificate and depends on libssl.so.3
// and libcrypto.so.3, where every other lookup lands; the other depends on libcrypto.so.3 alone.
// They are embedded in the binary and loaded from memory (memfd), so that no file beside the
// binary is needed. A civetweb that loads OpenSSL 3 by itself finds the same functions through
// them.
#pragma once

#include "absl/status/status.h"

namespace opserve::http {

// Loads the two objects, once per process; FAILED_PRECONDITION saying why where it cannot (no
// memfd, or a kernel that refuses to map memfds executable). Call before
// mg_init_library(MG_FEATURES_SSL).
absl::Status LoadOpenSslForCivetweb();

}  // namespace opserve::http
