// inference.GRPCInferenceService: the Open Inference Protocol (KServe v2) with Triton's
// shared-memory extensions, beside opserve.v1.OpServe on the same port and the same core
// (server_core.h: engine, store, limits, tokens, regions, metrics). Ops are models of version
// "1" (inputs `x`, or `a` and `b`; output `y`), and so are the tenant's saved graphs
// (SaveGraph). ModelInfer's conversions are oip_convert.h's; what a model looks like
// (ModelMetadata, ModelConfig) is model_info.h's; ModelStatistics counts what ModelInfer records
// (model_stats.h); ModelStreamInfer runs ModelInfer's calls over a stream (graph_stream.h). The
// specification's RPCs opserve does not serve answer UNIMPLEMENTED naming
// themselves (unserved_rpcs.cc). README.md's "Open Inference Protocol" section is the user's
// view.
#pragma once

#include <functional>
#include <string>

#include "inference/grpc_service.grpc.pb.h"
#include "server/rpc/model_stats.h"
#include "server/rpc/parsed_service.h"
#include "server/rpc/server_core.h"

namespace opserve {

class InferenceService final
    : public ParsedService<InferenceService, inference::GRPCInferenceService::CallbackService> {
 public:
  // `ready`: whether the server takes work (not draining, the device healthy).
  InferenceService(ServerCore& core, std::function<bool()> ready);

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest* req,
                                       inference::ServerLiveResponse* resp) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest* req,
                                        inference::ServerReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* req,
                                       inference::ModelReadyResponse* resp) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* req,
                                           inference::ServerMetadataResponse* resp) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* resp) override;
  // Not the generated override: its request carries the raw_input_contents received into the
  // receive pool (ParseUnaryLifting).
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const ParsedRequest<inference::ModelInferRequest>* req,
                                       inference::ModelInferResponse* resp);
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const inference::ModelConfigRequest* req,
                                        inference::ModelConfigResponse* resp) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* req,
                                            inference::ModelStatisticsResponse* resp) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
      inference::SystemSharedMemoryStatusResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
      inference::SystemSharedMemoryRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
      inference::SystemSharedMemoryUnregisterResponse* resp) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryStatusRequest* req,
      inference::CudaSharedMemoryStatusResponse* resp) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryRegisterRequest* req,
      inference::CudaSharedMemoryRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryUnregisterRequest* req,
      inference::CudaSharedMemoryUnregisterResponse* resp) override;

  // Not the generated ModelStreamInfer(ctx), which nothing calls: each message of the stream is
  // parsed as ModelInfer's request is (ParseUnaryLifting), and one that does not parse is
  // answered on the stream (graph_stream.h).
  grpc::ServerBidiReactor<ParsedRequest<inference::ModelInferRequest>,
                          inference::ModelStreamInferResponse>*
  StartModelStreamInfer(grpc::CallbackServerContext* ctx);
  // Not served (unserved_rpcs.cc): UNIMPLEMENTED, naming the RPC and what to use instead.
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const inference::RepositoryModelLoadRequest* req,
                                                inference::RepositoryModelLoadResponse* resp) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* ctx, const inference::RepositoryModelUnloadRequest* req,
      inference::RepositoryModelUnloadResponse* resp) override;
  grpc::ServerUnaryReactor* TraceSetting(grpc::CallbackServerContext* ctx,
                                         const inference::TraceSettingRequest* req,
                                         inference::TraceSettingResponse* resp) override;
  grpc::ServerUnaryReactor* LogSettings(grpc::CallbackServerContext* ctx,
                                        const inference::LogSettingsRequest* req,
                                        inference::LogSettingsResponse* resp) override;

  absl::Status RefuseUnparsed(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                              const absl::Status& parse) {
    return core_.RefuseUnparsed(ctx, rpc, parse);
  }

 private:
  // Runs `body` for the caller's tenant (UNAUTHENTICATED first when the token is wrong), counts
  // the call under `rpc` and finishes it with body's status.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                                  const std::function<absl::Status(const std::string&)>& body);

  SharedMemoryRegistry& regions() { return core_.regions(); }

  // The metadata of model `name` (version "" or "1") as `tenant` sees it: an op, or one of the
  // tenant's saved graphs; NOT_FOUND naming it otherwise.
  absl::Status Metadata(const std::string& tenant, const std::string& name,
                        const std::string& version, inference::ModelMetadataResponse* resp);

  ServerCore& core_;
  const std::function<bool()> ready_;
  ModelStats stats_;  // ModelInfer records, ModelStatistics reads
};

}  // namespace opserve
