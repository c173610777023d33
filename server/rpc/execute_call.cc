// Execute: the call, from the gRPC thread to the engine and back. convert.h turns the request
// into the engine's Graph and the engine's result into the ExecuteResponse.
#include <memory>
#include <vector>

#include "server/rpc/convert.h"
#include "server/rpc/graph_call.h"
#include "server/rpc/service.h"

namespace opserve {
namespace {

class ExecuteCall final : public GraphCall {
 public:
  ExecuteCall(ServerCore& core, grpc::CallbackServerContext* ctx,
              const ParsedRequest<v1::ExecuteRequest>& parsed, v1::ExecuteResponse* resp)
      : GraphCall(core, ctx, "Execute"), parsed_(parsed), resp_(resp) {}

  // The graph views the request, the receive blocks its large inline data came in
  // (lifted_parse.h) and the shared-memory regions it names (held in holds_): all kept until
  // the engine hands the request back.
  void Start() {
    absl::StatusOr<std::string> tenant = Admit();
    if (!tenant.ok()) return Reply(tenant.status());
    absl::StatusOr<Graph> graph = convert::GraphFromExecute(parsed_, core_.regions(), *tenant, &holds_);
    if (!graph.ok()) return Reply(graph.status());
    core_.engine().Submit(MakeRequest(*std::move(tenant), *std::move(graph)));
  }

 private:
  void Done(std::unique_ptr<Request> request) override {
    const absl::Status s = request->status();
    if (s.ok()) {
      convert::ResultToProto(std::move(request->result()), resp_, core_.engine().device_names());
      resp_->mutable_timing()->set_queue_us(request->queue_us());
    }
    request.reset();
    Reply(s);
  }

  // Nothing on the device reads what the graph viewed any more: it goes before the client hears
  // back, so that its next call finds it free.
  void Reply(const absl::Status& s) {
    holds_.clear();
    parsed_.ReleaseLifted();
    if (!s.ok()) resp_->Clear();
    resp_->mutable_timing()->set_total_us(ElapsedUs());
    Finish(s);
  }

  const ParsedRequest<v1::ExecuteRequest>& parsed_;
  v1::ExecuteResponse* const resp_;
  std::vector<RegionRange> holds_;
};

}  // namespace

grpc::ServerUnaryReactor* OpServeService::Execute(grpc::CallbackServerContext* ctx,
                                                  const ParsedRequest<v1::ExecuteRequest>* req,
                                                  v1::ExecuteResponse* resp) {
  auto* call = new ExecuteCall(core_, ctx, *req, resp);
  call->Start();
  return call;
}

}  // namespace opserve
