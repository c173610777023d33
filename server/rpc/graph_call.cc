#include "server/rpc/graph_call.h"

namespace opserve {

GraphCall::GraphCall(ServerCore& core, grpc::CallbackServerContext* ctx, absl::string_view rpc,
                     GraphEnd& end)
    : core_(core),
      ctx_(ctx),
      end_(end),
      rpc_(rpc),
      trace_(core.options().trace != nullptr ? core.options().trace->Add(rpc) : nullptr) {
  Mark(RequestTrace::kReceived);
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
  end_.End(s);
}

}  // namespace opserve
