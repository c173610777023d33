#include "server/rpc/service.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/convert.h"
#include "server/rpc/grpc_status.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

grpc::ServerUnaryReactor* OpServeService::DeleteTensor(grpc::CallbackServerContext* ctx,
                                                       const v1::DeleteTensorRequest* req,
                                                       v1::DeleteTensorResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = ctx->DefaultReactor();
  absl::Status s;
  {  // our reference to the erased tensor goes before the gauges read the budget
    auto tenant = core_.Authenticate(ctx);
    auto erased = tenant.ok() ? core_.store().Erase(req->name(), *tenant) : tenant.status();
    s = erased.status();
    if (erased.ok()) convert::TensorInfoToProto(**erased, core_.backend().device(), resp->mutable_info());
  }
  core_.UpdateStoreGauges();
  core_.RecordRpc("DeleteTensor", s, start);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::ListTensors(grpc::CallbackServerContext* ctx,
                                                      const v1::ListTensorsRequest*,
                                                      v1::ListTensorsResponse* resp) {
  const auto start = Clock::now();
  auto tenant = core_.Authenticate(ctx);
  if (tenant.ok()) {
    for (const StoredTensorPtr& t : core_.store().List(*tenant)) {
      convert::TensorInfoToProto(*t, core_.backend().device(), resp->add_tensors());
    }
  }
  core_.RecordRpc("ListTensors", tenant.status(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(tenant.status()));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::ListOps(grpc::CallbackServerContext* ctx,
                                                  const v1::ListOpsRequest*,
                                                  v1::ListOpsResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = ctx->DefaultReactor();
  if (auto tenant = core_.Authenticate(ctx); !tenant.ok()) {
    core_.RecordRpc("ListOps", tenant.status(), start);
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  convert::OpsToProto(core_.backend(), resp);
  core_.RecordRpc("ListOps", absl::OkStatus(), start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace opserve
