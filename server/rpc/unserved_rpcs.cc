// The Open Inference Protocol's RPCs that opserve does not serve. gRPC's own answer to a method
// without a handler is UNIMPLEMENTED with an empty message, which leaves a client guessing
// whether it reached the right server; these name the RPC and what opserve offers instead. They
// authenticate and are counted like any other call.
#include "absl/strings/str_cat.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/inference_service.h"

namespace opserve {
namespace {

absl::Status NotServed(absl::string_view rpc, absl::string_view instead) {
  return absl::UnimplementedError(
      absl::StrCat(rpc, " is not served by opserve (", instead, ")"));
}

constexpr absl::string_view kRepository =
    "its models are its ops, always loaded, and the caller's saved graphs: opserve.v1 SaveGraph "
    "and DeleteGraph add and remove those";

}  // namespace

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* ctx, const inference::RepositoryModelLoadRequest*,
    inference::RepositoryModelLoadResponse*) {
  return Unary(ctx, "RepositoryModelLoad",
               [](const std::string&) { return NotServed("RepositoryModelLoad", kRepository); });
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* ctx, const inference::RepositoryModelUnloadRequest*,
    inference::RepositoryModelUnloadResponse*) {
  return Unary(ctx, "RepositoryModelUnload",
               [](const std::string&) { return NotServed("RepositoryModelUnload", kRepository); });
}

grpc::ServerUnaryReactor* InferenceService::TraceSetting(grpc::CallbackServerContext* ctx,
                                                         const inference::TraceSettingRequest*,
                                                         inference::TraceSettingResponse*) {
  return Unary(ctx, "TraceSetting", [](const std::string&) {
    return NotServed("TraceSetting", "request timelines are the server's --trace_requests flag");
  });
}

grpc::ServerUnaryReactor* InferenceService::LogSettings(grpc::CallbackServerContext* ctx,
                                                        const inference::LogSettingsRequest*,
                                                        inference::LogSettingsResponse*) {
  return Unary(ctx, "LogSettings", [](const std::string&) {
    return NotServed("LogSettings", "it logs to its standard error and has no log settings");
  });
}

}  // namespace opserve
