// Loaded in place of "libssl.so" for civetweb (civetweb_openssl.h): every OpenSSL 3 function
// civetweb looks up comes from libssl.so.3 and libcrypto.so.3 behind this object, and the one it
// looks up under its OpenSSL 1.1 name, which OpenSSL 3 keeps only as a macro, is defined here.
#include <openssl/ssl.h>

#undef SSL_get_peer_certificate

extern "C" __attribute__((visibility("default"))) X509* SSL_get_peer_certificate(const SSL* s) {
  return SSL_get1_peer_certificate(s);
}
