#include "server/rpc/service.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/convert.h"
#include "server/rpc/grpc_status.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// The server's deadline is the client's timeout counted from the request's arrival, so it lies
// later than the client's own by the request's transit: the client's cancel at its deadline
// reaches a server whose clock has not got there yet. 20 ms covered the ASan build; a TSan build
// of the server (CI) took longer than that to receive a request.
constexpr std::chrono::milliseconds kDeadlineSlack{100};

}  // namespace

absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx) {
  // The deadline first: gRPC also marks an expired call cancelled.
  const auto now = std::chrono::system_clock::now();
  if (now > ctx->deadline()) return absl::DeadlineExceededError("the request's deadline passed");
  if (ctx->IsCancelled()) {
    // A cancellation this close to the deadline is the client's deadline (kDeadlineSlack), or
    // gRPC's timer firing a moment before this clock gets there.
    if (now + kDeadlineSlack >= ctx->deadline()) {
      return absl::DeadlineExceededError("the request's deadline passed");
    }
    return absl::CancelledError("the client cancelled the request");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> OpServeService::Authenticate(grpc::CallbackServerContext* ctx) const {
  if (options_.tokens.empty()) return std::string();
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.substr(0, kBearer.size()) != kBearer) {
    return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
  }
  auto tenant = options_.tokens.find(std::string(value.substr(kBearer.size())));
  if (tenant == options_.tokens.end()) return absl::UnauthenticatedError("unknown bearer token");
  return tenant->second;
}

void OpServeService::RecordRpc(absl::string_view rpc, const absl::Status& s,
                               Clock::time_point start) {
  if (metrics_ == nullptr) return;
  metrics_->RecordRequest(std::string_view(rpc.data(), rpc.size()), s.code(), MicrosSince(start) * 1e-6);
}

void OpServeService::UpdateStoreGauges() {
  if (metrics_ == nullptr) return;
  const MemoryStats m = backend().Memory();
  metrics_->SetMemory(m.used, m.budget, m.total);
  metrics_->SetTensors(static_cast<int64_t>(store_.size()));
}

grpc::ServerUnaryReactor* OpServeService::DeleteTensor(grpc::CallbackServerContext* ctx,
                                                       const v1::DeleteTensorRequest* req,
                                                       v1::DeleteTensorResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = ctx->DefaultReactor();
  absl::Status s;
  {  // our reference to the erased tensor goes before the gauges read the budget
    auto tenant = Authenticate(ctx);
    auto erased = tenant.ok() ? store_.Erase(req->name(), *tenant) : tenant.status();
    s = erased.status();
    if (erased.ok()) convert::TensorInfoToProto(**erased, backend().device(), resp->mutable_info());
  }
  UpdateStoreGauges();
  RecordRpc("DeleteTensor", s, start);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::ListTensors(grpc::CallbackServerContext* ctx,
                                                      const v1::ListTensorsRequest*,
                                                      v1::ListTensorsResponse* resp) {
  const auto start = Clock::now();
  auto tenant = Authenticate(ctx);
  if (tenant.ok()) {
    for (const StoredTensorPtr& t : store_.List(*tenant)) {
      convert::TensorInfoToProto(*t, backend().device(), resp->add_tensors());
    }
  }
  RecordRpc("ListTensors", tenant.status(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(tenant.status()));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::ListOps(grpc::CallbackServerContext* ctx,
                                                  const v1::ListOpsRequest*,
                                                  v1::ListOpsResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = ctx->DefaultReactor();
  if (auto tenant = Authenticate(ctx); !tenant.ok()) {
    RecordRpc("ListOps", tenant.status(), start);
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  convert::OpsToProto(backend(), resp);
  RecordRpc("ListOps", absl::OkStatus(), start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace opserve
