// Execute and ExecuteStream: the call, from the gRPC thread to the engine and back. convert.h
// turns the request into the engine's Graph and the engine's result into the ExecuteResponse.
// A unary Execute is one ExecuteCall (UnaryGraphCall); each request of an ExecuteStream is one
// too (graph_stream.h), its answer written on the stream.
#include <memory>
#include <optional>
#include <vector>

#include "server/rpc/convert.h"
#include "server/rpc/graph_call.h"
#include "server/rpc/graph_stream.h"
#include "server/rpc/service.h"

namespace opserve {
namespace {

class ExecuteCall final : public GraphCall {
 public:
  // `request` and `lifts` are one parsed request's (a stream's request wraps it).
  ExecuteCall(ServerCore& core, grpc::CallbackServerContext* ctx, GraphEnd& end,
              absl::string_view rpc, const v1::ExecuteRequest& request, const ParsedLifts& lifts,
              v1::ExecuteResponse* resp)
      : GraphCall(core, ctx, rpc, end), request_(request), lifts_(lifts), resp_(resp) {}

  // The graph views the request, the receive blocks its large inline data came in
  // (lifted_parse.h) and the shared-memory regions it names (held in holds_): all kept until
  // the engine hands the request back.
  void Start() {
    absl::StatusOr<std::string> tenant = Admit();
    if (!tenant.ok()) return Reply(tenant.status());
    absl::StatusOr<Graph> graph =
        convert::GraphFromExecute(request_, lifts_, core_.regions(), *tenant, &holds_);
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
    lifts_.ReleaseLifted();
    if (!s.ok()) resp_->Clear();
    resp_->mutable_timing()->set_total_us(ElapsedUs());
    Finish(s);
  }

  const v1::ExecuteRequest& request_;
  const ParsedLifts& lifts_;
  v1::ExecuteResponse* const resp_;
  std::vector<RegionRange> holds_;
};

// ExecuteStream's requests, each an ExecuteCall whose response is the stream response's.
struct ExecuteStreamTraits {
  using In = v1::ExecuteStreamRequest;
  using Out = v1::ExecuteStreamResponse;
  using Call = ExecuteCall;
  static constexpr absl::string_view kRpc = "ExecuteStream";

  void StartCall(std::optional<ExecuteCall>& call, ServerCore& core,
                 grpc::CallbackServerContext* ctx, GraphEnd& end, const ParsedRequest<In>& parsed,
                 Out* out) const {
    call.emplace(core, ctx, end, kRpc, parsed.message.request(), parsed, out->mutable_response());
    call->Start();
  }
  static void Answered(const ParsedRequest<In>& parsed, const absl::Status& s, Out* out) {
    out->set_id(parsed.message.id());
    if (s.ok()) return;
    v1::RequestStatus* status = out->mutable_status();  // the response, cleared, goes
    status->set_code(static_cast<int>(s.code()));
    status->set_message(std::string(s.message()));
  }
};

}  // namespace

grpc::ServerUnaryReactor* OpServeService::Execute(grpc::CallbackServerContext* ctx,
                                                  const ParsedRequest<v1::ExecuteRequest>* req,
                                                  v1::ExecuteResponse* resp) {
  return UnaryGraphCall<ExecuteCall>::Start(core_, ctx, "Execute", req->message, *req, resp);
}

grpc::ServerBidiReactor<ParsedRequest<v1::ExecuteStreamRequest>, v1::ExecuteStreamResponse>*
OpServeService::StartExecuteStream(grpc::CallbackServerContext* ctx) {
  // Each request is parsed the ordinary way: a stream carries many small requests, and the
  // receive pool's lifting (lifted_parse.h) reads a large field at the top of Execute's
  // request, not inside ExecuteStreamRequest.
  return new GraphStream<ExecuteStreamTraits>(core_, ctx, /*lift_path=*/nullptr);
}

}  // namespace opserve
