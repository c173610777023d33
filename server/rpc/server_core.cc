#include "server/rpc/server_core.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "inference/grpc_service.grpc.pb.h"
#include "opserve/v1/opserve.grpc.pb.h"

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

EngineOptions EngineOptionsOf(const ServiceOptions& options) {
  EngineOptions e{.limits = options.limits, .max_batch_size = options.max_batch_size};
#if OPSERVE_TEST_HOOKS
  e.fail_algorithm = options.fail_algorithm;
  e.reply_without_device = options.reply_without_device;
  e.fail_device = options.fail_device;
#endif
  return e;
}

}  // namespace

std::vector<std::string> MetricRpcNames() {
  std::vector<std::string> names;
  for (const char* full_name :
       {v1::OpServe::service_full_name(), inference::GRPCInferenceService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(full_name);
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      names.push_back(service->method(i)->name());
    }
  }
  return names;
}

std::vector<std::string> QueuedRpcNames() {
  return {"Execute", "ExecuteStream", "ModelInfer", "ModelStreamInfer"};
}

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

ServerCore::ServerCore(std::span<Device* const> devices, TensorStore& store, Metrics* metrics,
                       Collectives* collectives, ServiceOptions options)
    : options_(std::move(options)),
      engine_(devices, store, metrics, collectives, EngineOptionsOf(options_)),
      // Registered host memory is portable: one device's registration serves them all.
      receive_pool_(ReceivePool::Create(&devices[0]->backend(), ReceiveCacheBytes(options_.limits))) {
  if (metrics != nullptr) {
    receive_pool_->SetObserver([metrics](uint64_t in_use, uint64_t idle) {
      metrics->SetReceiveBuffers(in_use, idle);
    });
  }
}

absl::StatusOr<std::string> ServerCore::Authenticate(grpc::CallbackServerContext* ctx) const {
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

absl::StatusOr<std::string> ServerCore::Admit(grpc::CallbackServerContext* ctx) {
  absl::StatusOr<std::string> tenant = Authenticate(ctx);
  if (!tenant.ok()) return tenant;
  if (absl::Status serving = engine_.AnyServing(); !serving.ok()) return serving;
  if (absl::Status alive = CheckCallAlive(ctx); !alive.ok()) return alive;
  return tenant;
}

absl::Status ServerCore::RefuseUnparsed(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                                        const absl::Status& parse) {
  const auto start = Clock::now();
  absl::StatusOr<std::string> tenant = Authenticate(ctx);
  const absl::Status s =
      tenant.ok() ? absl::Status(parse.code(), absl::StrCat(rpc, ": ", parse.message()))
                  : tenant.status();
  RecordRpc(rpc, s, start);
  return s;
}

void ServerCore::RecordRpc(absl::string_view rpc, const absl::Status& s, Clock::time_point start) {
  if (metrics() == nullptr) return;
  metrics()->RecordRequest(std::string_view(rpc.data(), rpc.size()), s.code(),
                           MicrosSince(start) * 1e-6);
}

}  // namespace opserve
