// Execute: the request's graph as sent (convert.h), its result as ExecuteResponse.
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/rpc/convert.h"
#include "server/rpc/graph_call.h"
#include "server/rpc/service.h"

namespace opserve {
namespace {

class ExecuteCall final : public GraphCall {
 public:
  ExecuteCall(OpServeService& svc, grpc::CallbackServerContext* ctx,
              const ParsedRequest<v1::ExecuteRequest>& parsed, v1::ExecuteResponse* resp)
      : GraphCall(svc, ctx, "Execute"), parsed_(parsed), req_(parsed.message), resp_(resp) {}

 private:
  // The graph views req_ and the receive blocks its large inline data came in (lifted_parse.h),
  // which gRPC keeps until OnDone: so do the plan's inline inputs. An inline tensor in a
  // shared-memory region is viewed there, the region held until the device is done with it.
  absl::StatusOr<Graph> MakeGraph(const std::string& tenant) override {
    Graph g = convert::GraphFromProto(req_);
    for (GraphInline& t : g.inlines) {
      const v1::Tensor& proto = req_.inline_tensors().at(std::string(t.name));
      const std::optional<absl::string_view> lifted = LiftedByKey(parsed_.lifted, t.name);
      if (lifted) t.data = *lifted;
      if (!proto.has_shm()) continue;
      const std::string what = absl::StrCat("inline tensor ", Quote(t.name));
      if (!proto.data().empty() || lifted) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": give its bytes in data or in a shared memory region, not both"));
      }
      const v1::SharedMemoryRef& shm = proto.shm();
      auto r = ResolveRegion(svc_.regions(), tenant, shm.region(), shm.offset(), shm.byte_size());
      if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat(what, ": ", r.status().message()));
      if (r->host != nullptr) {
        t.data = absl::string_view(r->host, shm.byte_size());
      } else {
        t.device = r->device;  // the plan checks the size against the shape either way
      }
      holds_.push_back(*std::move(r));
    }
    return g;
  }
  void ReleaseInputs() override {
    holds_.clear();
    parsed_.ReleaseLifted();
  }
  absl::Status Respond(ExecuteResult result, double queue_us) override {
    convert::ResultToProto(std::move(result), resp_);
    resp_->mutable_timing()->set_queue_us(queue_us);
    return absl::OkStatus();
  }
  void ClearResponse() override { resp_->Clear(); }
  void SetTotalUs(double us) override { resp_->mutable_timing()->set_total_us(us); }

  const ParsedRequest<v1::ExecuteRequest>& parsed_;
  const v1::ExecuteRequest& req_;
  v1::ExecuteResponse* const resp_;
  std::vector<RegionRange> holds_;
};

}  // namespace

grpc::ServerUnaryReactor* OpServeService::Execute(grpc::CallbackServerContext* ctx,
                                                  const ParsedRequest<v1::ExecuteRequest>* req,
                                                  v1::ExecuteResponse* resp) {
  auto* call = new ExecuteCall(*this, ctx, *req, resp);
  call->Start();
  return call;
}

}  // namespace opserve
