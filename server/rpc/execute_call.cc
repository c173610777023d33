// Execute: the request's graph as sent (convert.h), its result as ExecuteResponse.
#include "server/rpc/convert.h"
#include "server/rpc/graph_call.h"
#include "server/rpc/service.h"

namespace opserve {
namespace {

class ExecuteCall final : public GraphCall {
 public:
  ExecuteCall(OpServeService& svc, grpc::CallbackServerContext* ctx,
              const v1::ExecuteRequest& req, v1::ExecuteResponse* resp)
      : GraphCall(svc, ctx, "Execute"), req_(req), resp_(resp) {}

 private:
  // The graph views req_, which gRPC keeps until OnDone: so do the plan's inline inputs.
  absl::StatusOr<Graph> MakeGraph(const std::string&) override {
    return convert::GraphFromProto(req_);
  }
  absl::Status Respond(ExecuteResult result, double queue_us) override {
    convert::ResultToProto(std::move(result), resp_);
    resp_->mutable_timing()->set_queue_us(queue_us);
    return absl::OkStatus();
  }
  void ClearResponse() override { resp_->Clear(); }
  void SetTotalUs(double us) override { resp_->mutable_timing()->set_total_us(us); }

  const v1::ExecuteRequest& req_;
  v1::ExecuteResponse* const resp_;
};

}  // namespace

grpc::ServerUnaryReactor* OpServeService::Execute(grpc::CallbackServerContext* ctx,
                                                  const v1::ExecuteRequest* req,
                                                  v1::ExecuteResponse* resp) {
  auto* call = new ExecuteCall(*this, ctx, *req, resp);
  call->Start();
  return call;
}

}  // namespace opserve
