// ModelInfer and ModelStreamInfer: the call, from the gRPC thread to the engine and back.
// oip_convert.h turns the request into the engine's Graph and the engine's result into the
// ModelInferResponse; each answer is counted in its model's statistics (model_stats.h). A unary
// ModelInfer is one InferCall (UnaryGraphCall); each request of a ModelStreamInfer is one too
// (graph_stream.h), its answer written on the stream.
#include <memory>
#include <optional>

#include "server/rpc/graph_call.h"
#include "server/rpc/graph_stream.h"
#include "server/rpc/inference_service.h"
#include "server/rpc/oip_convert.h"

namespace opserve {
namespace {

class InferCall final : public GraphCall {
 public:
  InferCall(ServerCore& core, grpc::CallbackServerContext* ctx, GraphEnd& end,
            absl::string_view rpc, const ParsedRequest<inference::ModelInferRequest>& parsed,
            inference::ModelInferResponse* resp, ModelStats& stats)
      : GraphCall(core, ctx, rpc, end), parsed_(parsed), resp_(resp), stats_(stats) {}

  // The graph views the request, the receive blocks its raw inputs came in (lifted_parse.h) and
  // what binding_ keeps (the saved graph, typed contents, the regions): all kept until the
  // engine hands the request back.
  void Start() {
    absl::StatusOr<std::string> tenant = Admit();
    if (!tenant.ok()) return Reply(tenant.status());
    tenant_ = *tenant;
    absl::StatusOr<Graph> graph = oip::GraphFromInfer(parsed_, *tenant, core_, &binding_);
    if (!graph.ok()) return Reply(graph.status());
    core_.engine().Submit(MakeRequest(*std::move(tenant), *std::move(graph)));
  }

 private:
  void Done(std::unique_ptr<Request> request) override {
    const absl::Status s = request->status();
    if (s.ok()) {
      const ExecuteResult& r = request->result();
      times_ = {.queue_us = request->queue_us(), .input_us = r.input_us,
                .compute_us = r.compute_us, .output_us = r.output_us,
                .batch_size = r.batch_size};
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
    times_.total_us = ElapsedUs();
    oip::SetTotalUs(times_.total_us, resp_);
    if (std::optional<StatsModel> model = CountedModel(); model.has_value()) {
      if (s.ok()) {
        stats_.RecordSuccess(*model, times_);
      } else {
        stats_.RecordFailure(*model, times_.total_us);
      }
    }
    Finish(s);
  }

  // The model whose statistics count this request: the op or the caller's saved graph it named,
  // at version "" or "1". None for a request refused before it had a tenant, or naming no model
  // the caller can run: no model's to count, as Triton counts none for a model it has not.
  std::optional<StatsModel> CountedModel() const {
    const inference::ModelInferRequest& req = parsed_.message;
    if (!tenant_.has_value() || !oip::CheckModelVersion(req.model_name(), req.model_version()).ok()) {
      return std::nullopt;
    }
    if (FindOp(req.model_name()) != nullptr) return StatsModel{*tenant_, req.model_name(), nullptr};
    SavedGraphPtr graph = binding_.saved;  // none yet when the conversion failed early
    if (graph == nullptr) {
      auto found = core_.graphs().Find(*tenant_, req.model_name());
      if (!found.ok()) return std::nullopt;
      graph = *std::move(found);
    }
    return StatsModel{*tenant_, req.model_name(), std::move(graph)};
  }

  const ParsedRequest<inference::ModelInferRequest>& parsed_;
  inference::ModelInferResponse* const resp_;
  oip::InferBinding binding_;
  ModelStats& stats_;
  std::optional<std::string> tenant_;  // once admitted
  RequestTimes times_;                 // the run's, on success; the total at the answer
};

// Where ModelInfer's raw_input_contents are received (lifted_parse.h), on a stream as in a call.
const LiftPath kInferLiftPath = {inference::ModelInferRequest::kRawInputContentsFieldNumber};

// ModelStreamInfer's requests, each an InferCall whose response is the stream response's.
struct InferStreamTraits {
  using In = inference::ModelInferRequest;
  using Out = inference::ModelStreamInferResponse;
  using Call = InferCall;
  static constexpr absl::string_view kRpc = "ModelStreamInfer";
  ModelStats& stats;

  void StartCall(std::optional<InferCall>& call, ServerCore& core,
                 grpc::CallbackServerContext* ctx, GraphEnd& end, const ParsedRequest<In>& parsed,
                 Out* out) const {
    call.emplace(core, ctx, end, kRpc, parsed, out->mutable_infer_response(), stats);
    call->Start();
  }
  // An error names its request too: the specification's error_message alone would leave a
  // client with many requests in flight unable to tell which one failed.
  static void Answered(const ParsedRequest<In>& parsed, const absl::Status& s, Out* out) {
    if (s.ok()) return;  // ResultToInfer set the id, as ModelInfer's response has it
    out->set_error_message(std::string(s.message()));
    inference::ModelInferResponse* r = out->mutable_infer_response();
    r->set_id(parsed.message.id());
    r->set_model_name(parsed.message.model_name());
    r->set_model_version(parsed.message.model_version());
  }
};

}  // namespace

grpc::ServerUnaryReactor* InferenceService::ModelInfer(
    grpc::CallbackServerContext* ctx, const ParsedRequest<inference::ModelInferRequest>* req,
    inference::ModelInferResponse* resp) {
  return UnaryGraphCall<InferCall>::Start(core_, ctx, "ModelInfer", *req, resp, stats_);
}

grpc::ServerBidiReactor<ParsedRequest<inference::ModelInferRequest>,
                        inference::ModelStreamInferResponse>*
InferenceService::StartModelStreamInfer(grpc::CallbackServerContext* ctx) {
  return new GraphStream<InferStreamTraits>(core_, ctx, &kInferLiftPath, {stats_});
}

}  // namespace opserve
