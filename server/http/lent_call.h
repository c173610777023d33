// ModelInfer through the in-process channel with the inputs' bytes sent from where the HTTP
// request was read: the message is serialized without them, and each raw_input_contents entry
// follows as slices that borrow the request's blocks. The generated stub would copy every byte
// into fresh memory first; for 128 MiB that copy and its page faults cost as much as the
// transfer (PERFORMANCE.md, "The Open Inference Protocol", measures the same for the client
// library's ModelInfer, which sends its inputs the same way).
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>

#include "inference/grpc_service.pb.h"
#include "server/http/infer_body.h"

namespace opserve::http {

// Returns once gRPC holds no slice of `request` any more, whatever the outcome.
grpc::Status LentModelInfer(grpc::GenericStub& stub, grpc::ClientContext* ctx,
                            const InferHttpRequest& request,
                            inference::ModelInferResponse* response);

}  // namespace opserve::http
