// ModelInfer: the call, from the gRPC thread to the engine and back. oip_convert.h turns the
// request into the engine's Graph and the engine's result into the ModelInferResponse.
#include <memory>

#include "server/rpc/graph_call.h"
#include "server/rpc/inference_service.h"
#include "server/rpc/oip_convert.h"

namespace opserve {
namespace {

class InferCall final : public GraphCall {
 public:
  InferCall(ServerCore& core, grpc::CallbackServerContext* ctx,
            const ParsedRequest<inference::ModelInferRequest>& parsed,
            inference::ModelInferResponse* resp)
      : GraphCall(core, ctx, "ModelInfer"), parsed_(parsed), resp_(resp) {}

  // The graph views the request, the receive blocks its raw inputs came in (lifted_parse.h) and
  // what binding_ keeps (the saved graph, typed contents, the regions): all kept until the
  // engine hands the request back.
  void Start() {
    absl::StatusOr<std::string> tenant = Admit();
    if (!tenant.ok()) return Reply(tenant.status());
    absl::StatusOr<Graph> graph = oip::GraphFromInfer(parsed_, *tenant, core_, &binding_);
    if (!graph.ok()) return Reply(graph.status());
    core_.engine().Submit(MakeRequest(*std::move(tenant), *std::move(graph)));
  }

 private:
  void Done(std::unique_ptr<Request> request) override {
    const absl::Status s = request->status();
    if (s.ok()) {
      oip::ResultToInfer(std::move(request->result()), request->queue_us(), parsed_.message,
                         binding_, resp_);
    }
    request.reset();
    Reply(s);
  }

  // Nothing on the device reads what the graph viewed any more: it goes before the client hears
  // back, so that its next call finds it free.
  void Reply(const absl::Status& s) {
    binding_.holds.clear();
    parsed_.ReleaseLifted();
    if (!s.ok()) resp_->Clear();
    oip::SetTotalUs(ElapsedUs(), resp_);
    Finish(s);
  }

  const ParsedRequest<inference::ModelInferRequest>& parsed_;
  inference::ModelInferResponse* const resp_;
  oip::InferBinding binding_;
};

}  // namespace

grpc::ServerUnaryReactor* InferenceService::ModelInfer(
    grpc::CallbackServerContext* ctx, const ParsedRequest<inference::ModelInferRequest>* req,
    inference::ModelInferResponse* resp) {
  auto* call = new InferCall(core_, ctx, *req, resp);
  call->Start();
  return call;
}

}  // namespace opserve
