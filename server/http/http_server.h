// The Open Inference Protocol's HTTP/REST binding (KServe v2 as Triton serves it, with the
// binary tensor data and shared-memory extensions) beside the gRPC server, in the same process.
// It keeps no logic of its own: each request becomes the inference.* protobuf message of its
// RPC, goes through the gRPC server's in-process channel to the same InferenceService (the
// Authorization header travels as the call's `authorization` metadata, so tokens, tenants,
// limits, statistics and metrics are the gRPC calls'), and the answer comes back as JSON.
// civetweb serves HTTP (HTTPS with the gRPC port's certificate and key); RapidJSON reads and
// writes the JSON (json_proto.h, infer_body.h); routes.h maps the paths to the RPCs.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "inference/grpc_service.grpc.pb.h"

struct mg_context;
struct mg_connection;

namespace opserve::http {

struct HttpOptions {
  std::string host;
  int port = 8000;  // 0: pick a free one
  // The gRPC server's TLS flags: HTTPS with the same certificate and key, client certificates
  // required with a client CA.
  std::string tls_cert, tls_key, tls_client_ca;
  // Largest request body (the gRPC server's message limit): 413 beyond it, before it is read.
  uint64_t max_body_bytes = 0;
  // Sent as x-opserve-replica on every answer, as the gRPC answers carry it, so that a proxy's
  // client can tell which replica answered.
  std::string replica_name;
};

class HttpServer {
 public:
  // Listens, or returns why not (a port in use names itself).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpOptions& options,
                                                           std::shared_ptr<grpc::Channel> channel);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  bool tls() const { return !options_.tls_cert.empty(); }
  const HttpOptions& options() const { return options_; }
  grpc::Channel& channel() const { return *channel_; }

  // Stops listening and waits for the requests being answered.
  void Stop();

 private:
  HttpServer(const HttpOptions& options, std::shared_ptr<grpc::Channel> channel)
      : options_(options), channel_(std::move(channel)) {}
  static int Handle(struct mg_connection* conn, void* self);
  static int InitSsl(void* ssl_ctx, void* self);

  const HttpOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

}  // namespace opserve::http
