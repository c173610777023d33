#include "server/rpc/security.h"

#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace opserve {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_path, const std::string& key_path, const std::string& client_ca_path) {
  if (cert_path.empty() && key_path.empty()) {
    if (!client_ca_path.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (cert_path.empty() || key_path.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  auto cert = ReadFile(cert_path, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(key_path, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions opts(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  if (!client_ca_path.empty()) {
    auto ca = ReadFile(client_ca_path, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::map<std::string, std::string>> LoadTokens(const std::string& path) {
  auto text = ReadFile(path, "--auth_tokens_file");
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> tokens;
  std::istringstream lines(*text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#') continue;
    std::string tenant, token;
    if (auto colon = l.find(':'); colon != absl::string_view::npos) {
      tenant = std::string(absl::StripAsciiWhitespace(l.substr(0, colon)));
      token = std::string(absl::StripAsciiWhitespace(l.substr(colon + 1)));
    } else {
      tenant = token = std::string(l);
    }
    if (tenant.empty() || token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": expected 'tenant:token'"));
    }
    if (!tokens.emplace(token, tenant).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": a token appears twice"));
    }
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));
  return tokens;
}

}  // namespace opserve
