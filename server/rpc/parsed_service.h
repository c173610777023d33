// A generated callback service whose unary methods parse their requests in the handler
// (request_parsing.h says why): a request that parses reaches the derived class's method, one
// that does not is answered through Derived::RefuseUnparsed (INVALID_ARGUMENT naming the RPC and
// the field). Both of the server's services, opserve.v1.OpServe and inference's, derive from it.
#pragma once

#include <grpcpp/support/server_callback.h>

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/request_parsing.h"

namespace opserve {

template <typename Derived, typename Generated>
class ParsedService : public Generated {
 protected:
  // `service` is the full name of the generated service, e.g. "opserve.v1.OpServe".
  explicit ParsedService(absl::string_view service) : service_(service) {}

  // Replaces gRPC's handler of `rpc` with one whose request type is ParsedRequest<Request>. Runs
  // in the derived constructor, before the server starts. (The generated SetMessageAllocatorFor_*
  // would cast these handlers to the wrong type: unused.)
  template <typename Request, typename Response>
  void ParseUnary(absl::string_view rpc,
                  grpc::ServerUnaryReactor* (Derived::*method)(grpc::CallbackServerContext*,
                                                               const Request*, Response*)) {
    this->MarkMethodCallback(
        MethodIndex(rpc),
        new grpc::internal::CallbackUnaryHandler<ParsedRequest<Request>, Response>(
            [this, rpc, method](grpc::CallbackServerContext* ctx, const ParsedRequest<Request>* req,
                                Response* resp) -> grpc::ServerUnaryReactor* {
              TakeOverParsed(req);
              Derived* self = static_cast<Derived*>(this);
              if (req->status.ok()) return (self->*method)(ctx, &req->message, resp);
              grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
              reactor->Finish(ToGrpcStatus(self->RefuseUnparsed(ctx, rpc, req->status)));
              return reactor;
            }));
  }

  // The position of `rpc` in the service, which is the index the generated code registers it at.
  int MethodIndex(absl::string_view rpc) const {
    return google::protobuf::DescriptorPool::generated_pool()
        ->FindServiceByName(service_)
        ->FindMethodByName(std::string(rpc))
        ->index();
  }

 private:
  const std::string service_;
};

}  // namespace opserve
