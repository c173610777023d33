// Each endpoint of routes.h as its RPC: the request message from the path and body, the call
// through the in-process channel, the answer in the JSON shape Triton's HTTP endpoints give.
#pragma once

#include <grpcpp/generic/generic_stub.h>

#include "inference/grpc_service.grpc.pb.h"
#include "server/http/exchange.h"
#include "server/http/routes.h"

namespace opserve::http {

// `generic`: ModelInfer's, which sends the inputs' bytes from where they were read (lent_call.h).
void Serve(const Route& route, Exchange& ex, inference::GRPCInferenceService::Stub& stub,
           grpc::GenericStub& generic);

}  // namespace opserve::http
