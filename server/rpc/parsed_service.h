// A generated callback service whose unary methods parse their requests in the handler
// (request_parsing.h says why): a request that parses reaches the derived class's method, one
// that does not is answered through Derived::RefuseUnparsed (INVALID_ARGUMENT naming the RPC and
// the field). Both of the server's services, opserve.v1.OpServe and inference's, derive from it.
#pragma once

#include <grpcpp/support/message_allocator.h>
#include <grpcpp/support/server_callback.h>

#include <memory>
#include <string>
#include <vector>

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
        Handler<Request, Response>(rpc, [method](Derived* self, grpc::CallbackServerContext* ctx,
                                                 const ParsedRequest<Request>* req, Response* resp) {
          return (self->*method)(ctx, &req->message, resp);
        }));
  }

  // ParseUnary for a method whose requests carry large `bytes` fields at `path` (ModelInfer's
  // raw_input_contents, Execute's inline tensor data): those are received into blocks of `pool`
  // (lifted_parse.h) and `method` gets the whole ParsedRequest, to find them in `lifted`.
  template <typename Request, typename Response>
  void ParseUnaryLifting(absl::string_view rpc, LiftPath path, std::shared_ptr<ReceivePool> pool,
                         grpc::ServerUnaryReactor* (Derived::*method)(
                             grpc::CallbackServerContext*, const ParsedRequest<Request>*, Response*)) {
    auto* handler = Handler<Request, Response>(
        rpc, [method](Derived* self, grpc::CallbackServerContext* ctx,
                      const ParsedRequest<Request>* req, Response* resp) {
          return (self->*method)(ctx, req, resp);
        });
    auto allocator = std::make_shared<LiftingAllocator<Request, Response>>(std::move(pool), std::move(path));
    handler->SetMessageAllocator(allocator.get());
    allocators_.push_back(std::move(allocator));
    this->MarkMethodCallback(MethodIndex(rpc), handler);
  }

  // The position of `rpc` in the service, which is the index the generated code registers it at.
  int MethodIndex(absl::string_view rpc) const {
    return google::protobuf::DescriptorPool::generated_pool()
        ->FindServiceByName(service_)
        ->FindMethodByName(std::string(rpc))
        ->index();
  }

 private:
  // The handler both register: a request that parsed goes to `call`, one that did not is
  // answered through Derived::RefuseUnparsed.
  template <typename Request, typename Response, typename Call>
  grpc::internal::CallbackUnaryHandler<ParsedRequest<Request>, Response>* Handler(
      absl::string_view rpc, Call call) {
    return new grpc::internal::CallbackUnaryHandler<ParsedRequest<Request>, Response>(
        [this, rpc, call](grpc::CallbackServerContext* ctx, const ParsedRequest<Request>* req,
                          Response* resp) -> grpc::ServerUnaryReactor* {
          TakeOverParsed(req);
          Derived* self = static_cast<Derived*>(this);
          if (req->status.ok()) return call(self, ctx, req, resp);
          grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
          reactor->Finish(ToGrpcStatus(self->RefuseUnparsed(ctx, rpc, req->status)));
          return reactor;
        });
  }

  // Makes each call's request and response, the request told where its large entries go (the
  // default holder would build a ParsedRequest that knows no pool). Freed by gRPC after OnDone.
  template <typename Request, typename Response>
  class LiftingAllocator final : public grpc::MessageAllocator<ParsedRequest<Request>, Response> {
   public:
    LiftingAllocator(std::shared_ptr<ReceivePool> pool, LiftPath path)
        : pool_(std::move(pool)), path_(std::move(path)) {}
    grpc::MessageHolder<ParsedRequest<Request>, Response>* AllocateMessages() override {
      return new Holder(pool_.get(), &path_);
    }

   private:
    struct Holder final : grpc::MessageHolder<ParsedRequest<Request>, Response> {
      Holder(ReceivePool* pool, const LiftPath* path) {
        request.lift_pool = pool;
        request.lift_path = path;
        this->set_request(&request);
        this->set_response(&response);
      }
      void Release() override { delete this; }
      ParsedRequest<Request> request;
      Response response;
    };
    const std::shared_ptr<ReceivePool> pool_;
    const LiftPath path_;
  };

  const std::string service_;
  std::vector<std::shared_ptr<void>> allocators_;  // the handlers point at them
};

}  // namespace opserve
