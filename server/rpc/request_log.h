// --log_requests: one line on stderr per finished call of the two services, e.g.
//   opserve: request method=ModelInfer name=sum tenant=alice code=OK ms=1.87
//            request_bytes=4123 response_bytes=4096 peer=ipv4:127.0.0.1:50712
// (one line). `name` is the model or graph the call names ("-" for the others), `tenant` the
// tenant of the caller's bearer token ("-" without tokens or with a token that is not known),
// the bytes are the messages' wire sizes summed over a stream. Never tensor contents, tokens or
// other metadata.
//
// A gRPC server interceptor: it sees every call of every method, unary and streaming, whatever
// its handler does, so that no handler has to report to it. Installed only with the flag; a
// server without it pays nothing.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <map>
#include <memory>
#include <string>

namespace opserve {

// The interceptor factory for ServerBuilder::experimental().SetInterceptorCreators. `tokens` is
// ServiceOptions::tokens (bearer token -> tenant).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRequestLog(
    std::map<std::string, std::string> tokens);

}  // namespace opserve
