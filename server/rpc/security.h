// TLS credentials and bearer tokens, loaded once at start-up from real files.
#pragma once

#include <grpcpp/security/server_credentials.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace opserve {

// Plaintext without a certificate; TLS with --tls_cert/--tls_key; mutual TLS (client
// certificates required and verified) with --tls_client_ca too.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_path, const std::string& key_path, const std::string& client_ca_path);

// A tokens file: one `tenant:token` (or a bare `token`, its own tenant) per line; blank lines and
// `#` comments are skipped. Returns token -> tenant. Tenants namespace the stored tensors.
absl::StatusOr<std::map<std::string, std::string>> LoadTokens(const std::string& path);

}  // namespace opserve
