// The gRPC handlers of opserve.v1.OpServe (callback API), on the core it shares with the Open
// Inference Protocol (server_core.h). Handlers are thin: Execute converts the request
// (convert.h) and hands it to the engine, whose lanes finish the call (execute_call.cc), and
// ExecuteStream does the same for each request of its stream (graph_stream.h); the others answer
// on the gRPC thread or through the transfer reactors.
#pragma once

#include <string>

#include "opserve/v1/opserve.grpc.pb.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/parsed_service.h"
#include "server/rpc/request_parsing.h"
#include "server/rpc/server_core.h"

namespace opserve {

class OpServeService final
    : public ParsedService<OpServeService, v1::OpServe::CallbackService> {
 public:
  explicit OpServeService(ServerCore& core)
      : ParsedService("opserve.v1.OpServe"), core_(core) {
    ParseRequestsInHandlers();
  }

  // PutTensor reads its messages as ParsedStreamMessage (see ParseRequestsInHandlers), so its
  // reactor is not the generated PutTensor(ctx, resp) override, which nothing calls.
  grpc::ServerReadReactor<ParsedStreamMessage<v1::PutTensorRequest>>* StartPutTensor(
      grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp);
  grpc::ServerWriteReactor<v1::GetTensorResponse>* GetTensor(
      grpc::CallbackServerContext* ctx, const v1::GetTensorRequest* req) override;
  grpc::ServerUnaryReactor* DeleteTensor(grpc::CallbackServerContext* ctx,
                                         const v1::DeleteTensorRequest* req,
                                         v1::DeleteTensorResponse* resp) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const v1::ListTensorsRequest* req,
                                        v1::ListTensorsResponse* resp) override;
  grpc::ServerUnaryReactor* MoveTensor(grpc::CallbackServerContext* ctx,
                                       const v1::MoveTensorRequest* req,
                                       v1::MoveTensorResponse* resp) override;
  // Not the generated override: its request carries the inline tensors' data received into the
  // receive pool (ParseUnaryLifting).
  grpc::ServerUnaryReactor* Execute(grpc::CallbackServerContext* ctx,
                                    const ParsedRequest<v1::ExecuteRequest>* req,
                                    v1::ExecuteResponse* resp);
  // Not the generated ExecuteStream(ctx) (which nothing calls) either: each message of the stream is parsed as a unary
  // request is (ParsedRequest), and one that does not parse is answered on the stream.
  grpc::ServerBidiReactor<ParsedRequest<v1::ExecuteStreamRequest>, v1::ExecuteStreamResponse>*
  StartExecuteStream(grpc::CallbackServerContext* ctx);
  grpc::ServerUnaryReactor* ListOps(grpc::CallbackServerContext* ctx,
                                    const v1::ListOpsRequest* req,
                                    v1::ListOpsResponse* resp) override;
  grpc::ServerUnaryReactor* SaveGraph(grpc::CallbackServerContext* ctx,
                                      const v1::SaveGraphRequest* req,
                                      v1::SaveGraphResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteGraph(grpc::CallbackServerContext* ctx,
                                        const v1::DeleteGraphRequest* req,
                                        v1::DeleteGraphResponse* resp) override;
  grpc::ServerUnaryReactor* ListGraphs(grpc::CallbackServerContext* ctx,
                                       const v1::ListGraphsRequest* req,
                                       v1::ListGraphsResponse* resp) override;

  ServerCore& core() { return core_; }
  absl::Status RefuseUnparsed(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                              const absl::Status& parse) {
    return core_.RefuseUnparsed(ctx, rpc, parse);
  }

 private:
  // gRPC's generated handlers end a call whose request does not parse with a bare UNIMPLEMENTED
  // and never call the service (server/request_parsing.h says when and why). These replace them,
  // method by method (parsed_service.h). Runs once, in the constructor.
  void ParseRequestsInHandlers() {
    ParseUnary("DeleteTensor", &OpServeService::DeleteTensor);
    ParseUnary("ListTensors", &OpServeService::ListTensors);
    ParseUnary("MoveTensor", &OpServeService::MoveTensor);
    ParseUnaryLifting("Execute",
                      {v1::ExecuteRequest::kInlineTensorsFieldNumber, /*the map entry's value*/ 2,
                       v1::Tensor::kDataFieldNumber},
                      core_.receive_pool(), &OpServeService::Execute);
    ParseUnary("ListOps", &OpServeService::ListOps);
    ParseUnary("SaveGraph", &OpServeService::SaveGraph);
    ParseUnary("DeleteGraph", &OpServeService::DeleteGraph);
    ParseUnary("ListGraphs", &OpServeService::ListGraphs);
    using GetRequest = ParsedRequest<v1::GetTensorRequest>;
    MarkMethodCallback(
        MethodIndex("GetTensor"),
        new grpc::internal::CallbackServerStreamingHandler<GetRequest, v1::GetTensorResponse>(
            [this](grpc::CallbackServerContext* ctx,
                   const GetRequest* req) -> grpc::ServerWriteReactor<v1::GetTensorResponse>* {
              TakeOverParsed(req);
              if (req->status.ok()) return GetTensor(ctx, &req->message);
              return new FinishedWriteReactor<v1::GetTensorResponse>(
                  ToGrpcStatus(RefuseUnparsed(ctx, "GetTensor", req->status)));
            }));
    MarkMethodCallback(
        MethodIndex("ExecuteStream"),
        new grpc::internal::CallbackBidiHandler<ParsedRequest<v1::ExecuteStreamRequest>,
                                                v1::ExecuteStreamResponse>(
            [this](grpc::CallbackServerContext* ctx) { return StartExecuteStream(ctx); }));
    // Each message of the stream is checked by the reactor as it arrives.
    MarkMethodCallback(
        MethodIndex("PutTensor"),
        new grpc::internal::CallbackClientStreamingHandler<
            ParsedStreamMessage<v1::PutTensorRequest>, v1::PutTensorResponse>(
            [this](grpc::CallbackServerContext* ctx, v1::PutTensorResponse* resp) {
              return StartPutTensor(ctx, resp);
            }));
  }

  ServerCore& core_;
};

}  // namespace opserve
