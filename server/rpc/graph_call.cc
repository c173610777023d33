#include "server/rpc/graph_call.h"

#include "server/rpc/grpc_status.h"

namespace opserve {

// Counts itself among the core's active calls until gRPC is done with it (the response sent),
// so that the drain on SIGTERM waits for it.
GraphCall::GraphCall(ServerCore& core, grpc::CallbackServerContext* ctx, absl::string_view rpc)
    : core_(core),
      ctx_(ctx),
      rpc_(rpc),
      trace_(core.options().trace != nullptr ? core.options().trace->Add(rpc) : nullptr) {
  Mark(RequestTrace::kReceived);
  core_.CallStarted();
  if (core_.metrics() != nullptr) core_.metrics()->AddInflight(1);
}

double GraphCall::ElapsedUs() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
      .count();
}

void GraphCall::Finish(const absl::Status& s) {
  core_.RecordRpc(rpc_, s, start_);
  if (core_.metrics() != nullptr) core_.metrics()->AddInflight(-1);
  Mark(RequestTrace::kFinished);
  grpc::ServerUnaryReactor::Finish(ToGrpcStatus(s));
}

void GraphCall::OnDone() {
  Mark(RequestTrace::kDone);
  core_.CallDone();
  delete this;
}

}  // namespace opserve
