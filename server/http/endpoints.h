// Each endpoint of routes.h as its RPC: the request message from the path and body, the call
// through the in-process channel, the answer in the JSON shape Triton's HTTP endpoints give.
#pragma once

#include "inference/grpc_service.grpc.pb.h"
#include "server/http/exchange.h"
#include "server/http/routes.h"

namespace opserve::http {

void Serve(const Route& route, Exchange& ex, inference::GRPCInferenceService::Stub& stub);

}  // namespace opserve::http
