// Loaded in place of "libcrypto.so" for civetweb (civetweb_openssl.h): an object with that name
// whose only content is its dependency on libcrypto.so.3, where civetweb's lookups land. It makes
// HTTPS independent of libssl-dev's unversioned symlinks, which runtime images do not have.
extern "C" __attribute__((visibility("default"))) const int opserve_crypto_shim = 1;
