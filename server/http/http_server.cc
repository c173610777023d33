#include "server/http/http_server.h"

#include <civetweb.h>
#include <openssl/ssl.h>

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/http/civetweb_openssl.h"
#include "server/http/endpoints.h"
#include "server/http/exchange.h"
#include "server/http/routes.h"

namespace opserve::http {
namespace {

// Requests answered at once: each holds a thread for its call's whole run, as a gRPC
// synchronous client would.
constexpr char kThreads[] = "32";
// A 1 GiB body over a slow link still arrives: the limit is per send and receive, not per
// request.
constexpr char kRequestTimeoutMs[] = "120000";
// An idle keep-alive connection waits this long for its next request.
constexpr char kKeepAliveTimeoutMs[] = "30000";

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpOptions& options, std::shared_ptr<grpc::Channel> channel) {
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(channel)));
  server->stub_ = inference::GRPCInferenceService::NewStub(server->channel_);
  server->generic_ = std::make_unique<grpc::GenericStub>(server->channel_);
  const bool tls = server->tls();
  if (tls) {
    if (absl::Status loaded = LoadOpenSslForCivetweb(); !loaded.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the TLS flags ask for HTTPS on --http_port, but OpenSSL cannot be loaded for civetweb: ",
          loaded.message(), "; serve gRPC alone with --http_port=-1, or end TLS at a proxy"));
    }
    if ((mg_init_library(MG_FEATURES_SSL) & MG_FEATURES_SSL) == 0) {
      return absl::FailedPreconditionError(
          "the TLS flags ask for HTTPS on --http_port, but civetweb found no usable OpenSSL; "
          "serve gRPC alone with --http_port=-1, or end TLS at a proxy");
    }
  }
  if (!tls) mg_init_library(0);
  const std::string ports = absl::StrCat(options.host, ":", options.port, tls ? "s" : "");
  std::vector<const char*> opts = {"listening_ports",       ports.c_str(),
                                   "num_threads",           kThreads,
                                   "enable_keep_alive",     "yes",
                                   "tcp_nodelay",           "1",
                                   "request_timeout_ms",    kRequestTimeoutMs,
                                   "keep_alive_timeout_ms", kKeepAliveTimeoutMs};
  opts.push_back(nullptr);
  mg_callbacks callbacks{};
  if (tls) callbacks.init_ssl = &HttpServer::InitSsl;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = server.get();
  init.configuration_options = opts.data();
  char error[256] = "";
  mg_error_data err{};
  err.text = error;
  err.text_buffer_size = sizeof(error);
  server->ctx_ = mg_start2(&init, &err);
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve HTTP on ", options.host, ":", options.port, " (--http_port): ", error,
        "; the port is in use by another process, or the host is not an address of this machine"));
  }
  mg_server_port port{};
  if (mg_get_server_ports(server->ctx_, 1, &port) < 1) {
    return absl::UnavailableError("civetweb listens on no port");
  }
  server->port_ = port.port;
  // Every path: those no endpoint has answer the protocol's JSON error too.
  mg_set_request_handler(server->ctx_, "/", &HttpServer::Handle, server.get());
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (ctx_ != nullptr) mg_stop(ctx_);
  ctx_ = nullptr;
}

int HttpServer::Handle(mg_connection* conn, void* self) {
  auto* server = static_cast<HttpServer*>(self);
  Exchange ex(conn, server->options_.max_body_bytes, server->options_.replica_name);
  try {
    bool not_allowed = false;
    absl::StatusOr<Route> route = FindRoute(ex.method(), ex.path(), &not_allowed);
    if (!route.ok() && not_allowed) {
      ex.ReplyError(route.status(), /*http_status=*/405);
    } else if (!route.ok()) {
      ex.ReplyError(route.status());
    } else {
      Serve(*route, ex, *server->stub_, *server->generic_);
    }
  } catch (const std::exception& e) {  // e.g. no memory for a body within the limit
    if (!ex.replied()) ex.ReplyError(absl::InternalError(absl::StrCat("HTTP: ", e.what())));
  }
  return ex.status();
}

int HttpServer::InitSsl(void* ssl_ctx, void* self) {
  auto* server = static_cast<HttpServer*>(self);
  auto* ctx = static_cast<SSL_CTX*>(ssl_ctx);
  const HttpOptions& o = server->options_;
  if (SSL_CTX_use_certificate_chain_file(ctx, o.tls_cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, o.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return -1;
  }
  if (!o.tls_client_ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, o.tls_client_ca.c_str(), nullptr) != 1) return -1;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return 1;  // set up here: civetweb loads no certificate of its own
}

}  // namespace opserve::http
