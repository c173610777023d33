// SaveGraph, DeleteGraph, ListGraphs: the saved graphs that the Open Inference Protocol serves
// as models. A graph is checked when it is saved, as Execute would check it, so that a model
// that could never run is refused with Execute's message instead of at every ModelInfer.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/service.h"

namespace opserve {
namespace {

// The template with each -1 dimension of its inline tensors replaced by `any`.
v1::ExecuteRequest WithSizes(const v1::ExecuteRequest& graph, int64_t any) {
  v1::ExecuteRequest copy = graph;
  for (auto& [name, t] : *copy.mutable_inline_tensors()) {
    for (int64_t& d : *t.mutable_shape()) {
      if (d == -1) d = any;
    }
  }
  return copy;
}

absl::StatusOr<Plan> PlanWithSizes(const v1::ExecuteRequest& graph, int64_t any,
                                   ServerCore& svc, const std::string& tenant) {
  const v1::ExecuteRequest sized = WithSizes(graph, any);
  Graph g = convert::GraphFromProto(sized);
  g.shapes_only = true;
  return BuildPlan(g, svc.backend(), svc.store(), svc.options().limits, tenant);
}

absl::StatusOr<SavedGraphPtr> MakeSavedGraph(const v1::SaveGraphRequest& req, ServerCore& svc,
                                             const std::string& tenant) {
  const std::string& name = req.name();
  RETURN_IF_ERROR(CheckTensorName(name, "saved graph"));
  if (FindOp(name) != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "saved graph ", Quote(name), ": the name is the op model ", Quote(name), "'s; pick another"));
  }
  bool any_size = false;
  for (const auto& [input, t] : req.graph().inline_tensors()) {
    if (!t.data().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "saved graph ", Quote(name), ": inline tensor ", Quote(input), " carries ",
          t.data().size(), " bytes; a saved graph's inline tensors are its inputs, which each "
          "ModelInfer sends: give their dtype and shape only"));
    }
    for (int64_t d : t.shape()) any_size |= d == -1;
  }
  auto with_one = PlanWithSizes(req.graph(), 1, svc, tenant);
  if (!with_one.ok()) {
    return absl::Status(with_one.status().code(),
                        absl::StrCat("saved graph ", Quote(name), ": ", with_one.status().message()));
  }
  // Output dimensions that follow a -1 input dimension are -1 too: they differ between sizes.
  absl::StatusOr<Plan> with_two = any_size ? PlanWithSizes(req.graph(), 2, svc, tenant) : with_one;

  auto saved = std::make_shared<SavedGraph>();
  saved->request = req.graph();
  v1::GraphInfo& info = saved->info;
  info.set_name(name);
  info.set_nodes(req.graph().nodes_size());
  for (const auto& [input, t] : req.graph().inline_tensors()) {
    v1::GraphTensor* in = info.add_inputs();
    in->set_name(input);
    in->set_dtype(t.dtype());
    *in->mutable_shape() = t.shape();
  }
  for (const v1::OutputSpec& o : req.graph().outputs()) {
    if (!o.return_inline()) continue;
    for (size_t i = 0; i < with_one->nodes.size(); ++i) {
      const PlanNode& n = with_one->nodes[i];
      if (n.id != o.node()) continue;
      v1::GraphTensor* out = info.add_outputs();
      out->set_name(n.id);
      out->set_dtype(static_cast<v1::DType>(n.output.dtype));
      for (size_t d = 0; d < n.output.shape.size(); ++d) {
        const bool fixed = with_two.ok() && with_two->nodes[i].output.shape.size() > d &&
                           with_two->nodes[i].output.shape[d] == n.output.shape[d];
        out->add_shape(fixed ? n.output.shape[d] : -1);
      }
    }
  }
  return saved;
}

}  // namespace

grpc::ServerUnaryReactor* OpServeService::SaveGraph(grpc::CallbackServerContext* ctx,
                                                    const v1::SaveGraphRequest* req,
                                                    v1::SaveGraphResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::string tenant, core_.Authenticate(ctx));
    ASSIGN_OR_RETURN(SavedGraphPtr saved, MakeSavedGraph(*req, core_, tenant));
    RETURN_IF_ERROR(core_.graphs().Insert(tenant, req->name(), saved, req->overwrite()));
    *resp->mutable_info() = saved->info;
    return absl::OkStatus();
  }();
  core_.RecordRpc("SaveGraph", s, start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::DeleteGraph(grpc::CallbackServerContext* ctx,
                                                      const v1::DeleteGraphRequest* req,
                                                      v1::DeleteGraphResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::string tenant, core_.Authenticate(ctx));
    if (req->name().empty()) return absl::InvalidArgumentError("DeleteGraph: the name is empty");
    ASSIGN_OR_RETURN(auto erased, core_.graphs().Erase(tenant, req->name()));
    *resp->mutable_info() = erased.front()->info;
    return absl::OkStatus();
  }();
  core_.RecordRpc("DeleteGraph", s, start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* OpServeService::ListGraphs(grpc::CallbackServerContext* ctx,
                                                     const v1::ListGraphsRequest*,
                                                     v1::ListGraphsResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  auto tenant = core_.Authenticate(ctx);
  if (tenant.ok()) {
    for (const auto& [name, g] : core_.graphs().List(*tenant)) *resp->add_graphs() = g->info;
  }
  core_.RecordRpc("ListGraphs", tenant.status(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(tenant.status()));
  return reactor;
}

}  // namespace opserve
