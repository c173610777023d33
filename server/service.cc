#include "server/service.h"

#include "absl/strings/str_cat.h"
#include "server/executor.h"
#include "server/grpc_status.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

constexpr std::chrono::milliseconds kDeadlineSlack{20};

// Execute's reactor: a unary one that counts itself among the active calls until gRPC is done
// with it (the response sent), so that the drain on SIGTERM waits for it.
class ExecuteReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit ExecuteReactor(OpServeService* svc) : svc_(svc) { svc_->CallStarted(); }
  void OnDone() override {
    svc_->CallDone();
    delete this;
  }

 private:
  OpServeService* svc_;
};

}  // namespace

absl::Status CheckCallAlive(grpc::CallbackServerContext* ctx) {
  // The deadline first: gRPC also marks an expired call cancelled.
  const auto now = std::chrono::system_clock::now();
  if (now > ctx->deadline()) return absl::DeadlineExceededError("the request's deadline passed");
  if (ctx->IsCancelled()) {
    // gRPC's deadline timer can cancel the call a moment before this clock reaches the deadline
    // (seen in the ASan CI run: an expired request counted as CANCELLED). A cancellation that
    // close to the deadline is the deadline.
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

void FillTensorInfo(const StoredTensor& t, const std::string& device, v1::TensorInfo* info) {
  info->set_name(t.name);
  info->set_dtype(static_cast<v1::DType>(t.meta.dtype));
  for (int64_t d : t.meta.shape) info->add_shape(d);
  info->set_bytes(t.meta.Bytes());
  info->set_device(device);
}

void OpServeService::RecordRpc(absl::string_view rpc, const absl::Status& s,
                               Clock::time_point start) {
  if (metrics_ == nullptr) return;
  metrics_->RecordRequest(std::string_view(rpc.data(), rpc.size()), s.code(), MicrosSince(start) * 1e-6);
}

void OpServeService::UpdateStoreGauges() {
  if (metrics_ == nullptr) return;
  const MemoryStats m = backend_.Memory();
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
    auto ns = Authenticate(ctx);
    auto erased = ns.ok() ? store_.Erase(req->name(), *ns) : ns.status();
    s = erased.status();
    if (erased.ok()) FillTensorInfo(**erased, backend_.device(), resp->mutable_info());
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
  auto ns = Authenticate(ctx);
  if (ns.ok()) {
    for (const StoredTensorPtr& t : store_.List(*ns)) {
      FillTensorInfo(*t, backend_.device(), resp->add_tensors());
    }
  }
  RecordRpc("ListTensors", ns.status(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(ns.status()));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::ListOps(grpc::CallbackServerContext* ctx,
                                                  const v1::ListOpsRequest*,
                                                  v1::ListOpsResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = ctx->DefaultReactor();
  if (auto ns = Authenticate(ctx); !ns.ok()) {
    RecordRpc("ListOps", ns.status(), start);
    reactor->Finish(ToGrpcStatus(ns.status()));
    return reactor;
  }
  resp->set_backend(backend_.name());
  resp->set_device(backend_.description());
  for (const OpSpec& op : Ops()) {
    const auto algos = AlgorithmsFor(op.name, backend_);
    if (algos.empty()) continue;
    v1::OpInfo* info = resp->add_ops();
    info->set_name(std::string(op.name));
    info->set_description(std::string(op.description));
    // Exactly what this backend runs: the union of its algorithms' dtypes.
    for (DType d : DTypesFor(op.name, backend_)) info->add_dtypes(static_cast<v1::DType>(d));
    for (const AlgoSpec* a : algos) {
      v1::AlgorithmInfo* ai = info->add_algorithms();
      ai->set_name(std::string(a->name));
      for (DType d : a->dtypes) ai->add_dtypes(static_cast<v1::DType>(d));
      ai->set_deterministic(a->deterministic);
      ai->set_is_default(a->is_default);
      ai->set_description(std::string(a->description));
      if (a->is_default) info->set_default_algorithm(std::string(a->name));
    }
  }
  RecordRpc("ListOps", absl::OkStatus(), start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::Execute(grpc::CallbackServerContext* ctx,
                                                  const v1::ExecuteRequest* req,
                                                  v1::ExecuteResponse* resp) {
  const auto start = Clock::now();
  auto* reactor = new ExecuteReactor(this);
  auto finish = [this, reactor, start, resp](absl::Status s) {
    if (!s.ok()) resp->Clear();
    resp->mutable_timing()->set_total_us(MicrosSince(start));
    RecordRpc("Execute", s, start);
    if (metrics_) metrics_->AddInflight(-1);
    reactor->Finish(ToGrpcStatus(s));
  };
  if (metrics_) metrics_->AddInflight(1);
  auto ns = Authenticate(ctx);
  if (!ns.ok()) {
    finish(ns.status());
    return reactor;
  }
  if (absl::Status healthy = backend_.Healthy(); !healthy.ok()) {
    ReportUnhealthy();  // a transfer may have seen the failure first
    finish(healthy);
    return reactor;
  }
  // A call that is already dead (its deadline passed in transit) neither plans nor queues.
  if (absl::Status alive = CheckCallAlive(ctx); !alive.ok()) {
    finish(alive);
    return reactor;
  }
  auto plan = BuildPlan(*req, backend_, store_, options_.limits, *ns);
  if (!plan.ok()) {
    finish(plan.status());
    return reactor;
  }
  auto shared_plan = std::make_shared<Plan>(*std::move(plan));
  absl::Status queued = worker_.Submit([this, ctx, resp, start, shared_plan, finish](ExecEnv& env) -> DeviceWorker::Completion {
    const double queue_us = MicrosSince(start);
    if (metrics_) metrics_->RecordQueue("Execute", queue_us * 1e-6);
    absl::Status s = CheckCallAlive(ctx);
    if (s.ok()) {
      ExecuteContext ec{&backend_, &env, &store_, metrics_, [ctx] { return CheckCallAlive(ctx); },
                        options_.fail_algorithm, options_.limits.max_message_bytes};
      s = ExecutePlan(*shared_plan, ec, resp);
    }
    resp->mutable_timing()->set_queue_us(queue_us);
    if (!backend_.Healthy().ok()) ReportUnhealthy();
    // The plan (and the stored tensors it holds) is gone by the time this runs.
    return [this, finish, s] {
      UpdateStoreGauges();
      finish(s);
    };
  });
  if (!queued.ok()) finish(queued);
  return reactor;
}

}  // namespace opserve
