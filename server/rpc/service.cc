#include "server/rpc/service.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
    if (erased.ok()) convert::TensorInfoToProto(**erased, core_.engine().device_names(), resp->mutable_info());
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
      convert::TensorInfoToProto(*t, core_.engine().device_names(), resp->add_tensors());
    }
  }
  core_.RecordRpc("ListTensors", tenant.status(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(tenant.status()));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::MoveTensor(grpc::CallbackServerContext* ctx,
                                                     const v1::MoveTensorRequest* req,
                                                     v1::MoveTensorResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = ctx->DefaultReactor();
  // The copy may take a while and frees memory after: off the gRPC thread.
  core_.transfers().Post([this, ctx, req, resp, reactor, start] {
    absl::Status s = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::string tenant, core_.Authenticate(ctx));
      ASSIGN_OR_RETURN(StoredTensorPtr t, core_.store().Get(req->name(), tenant));
      Engine& engine = core_.engine();
      ASSIGN_OR_RETURN(int dst, engine.FindDevice(req->device(),
                                                  absl::StrCat("moving tensor ", Quote(req->name()))));
      uint64_t bytes = 0;
      ASSIGN_OR_RETURN(StoredTensorPtr moved, engine.CopyTo(*t, dst, &bytes));
      if (moved->buffer != t->buffer || t->sharded()) {
        RETURN_IF_ERROR(core_.store().Replace(t, moved, tenant));
      }
      convert::TensorInfoToProto(*moved, engine.device_names(), resp->mutable_info());
      resp->set_bytes(bytes);
      resp->set_seconds(std::chrono::duration<double>(Clock::now() - start).count());
      return absl::OkStatus();
    }();
    core_.UpdateStoreGauges();
    core_.RecordRpc("MoveTensor", s, start);
    reactor->Finish(ToGrpcStatus(s));
  });
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
  convert::OpsToProto(core_.engine(), resp);
  core_.RecordRpc("ListOps", absl::OkStatus(), start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace opserve
