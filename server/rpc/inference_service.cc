#include "server/rpc/inference_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/model_info.h"
#include "server/rpc/oip_convert.h"

#ifndef OPSERVE_VERSION
#define OPSERVE_VERSION "unknown"
#endif

namespace opserve {
namespace {

// The CUDA shared-memory extension exists on the CUDA backend only (ServerMetadata says so).
absl::Status NeedsCuda(const Backend& backend) {
  if (backend.name() == "cuda") return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "CUDA shared memory needs the CUDA backend; this server runs on ", backend.device()));
}

}  // namespace

InferenceService::InferenceService(ServerCore& core, std::function<bool()> ready)
    : ParsedService("inference.GRPCInferenceService"), core_(core), ready_(std::move(ready)) {
  ParseUnary("ServerLive", &InferenceService::ServerLive);
  ParseUnary("ServerReady", &InferenceService::ServerReady);
  ParseUnary("ModelReady", &InferenceService::ModelReady);
  ParseUnary("ServerMetadata", &InferenceService::ServerMetadata);
  ParseUnary("ModelMetadata", &InferenceService::ModelMetadata);
  ParseUnaryLifting("ModelInfer", {inference::ModelInferRequest::kRawInputContentsFieldNumber},
                    core.receive_pool(), &InferenceService::ModelInfer);
  MarkMethodCallback(MethodIndex("ModelStreamInfer"),
                     new grpc::internal::CallbackBidiHandler<
                         ParsedRequest<inference::ModelInferRequest>,
                         inference::ModelStreamInferResponse>(
                         [this](grpc::CallbackServerContext* ctx) {
                           return StartModelStreamInfer(ctx);
                         }));
  ParseUnary("ModelConfig", &InferenceService::ModelConfig);
  ParseUnary("ModelStatistics", &InferenceService::ModelStatistics);
  ParseUnary("RepositoryIndex", &InferenceService::RepositoryIndex);
  ParseUnary("RepositoryModelLoad", &InferenceService::RepositoryModelLoad);
  ParseUnary("RepositoryModelUnload", &InferenceService::RepositoryModelUnload);
  ParseUnary("SystemSharedMemoryStatus", &InferenceService::SystemSharedMemoryStatus);
  ParseUnary("SystemSharedMemoryRegister", &InferenceService::SystemSharedMemoryRegister);
  ParseUnary("SystemSharedMemoryUnregister", &InferenceService::SystemSharedMemoryUnregister);
  ParseUnary("CudaSharedMemoryStatus", &InferenceService::CudaSharedMemoryStatus);
  ParseUnary("CudaSharedMemoryRegister", &InferenceService::CudaSharedMemoryRegister);
  ParseUnary("CudaSharedMemoryUnregister", &InferenceService::CudaSharedMemoryUnregister);
  ParseUnary("TraceSetting", &InferenceService::TraceSetting);
  ParseUnary("LogSettings", &InferenceService::LogSettings);
}

grpc::ServerUnaryReactor* InferenceService::Unary(
    grpc::CallbackServerContext* ctx, absl::string_view rpc,
    const std::function<absl::Status(const std::string&)>& body) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> tenant = core_.Authenticate(ctx);
  const absl::Status s = tenant.ok() ? body(*tenant) : tenant.status();
  core_.RecordRpc(rpc, s, start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// Liveness and readiness answer without a token, as grpc.health.v1 does: probes carry none.
grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* ctx,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  resp->set_live(true);
  core_.RecordRpc("ServerLive", absl::OkStatus(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* ctx,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* resp) {
  const auto start = std::chrono::steady_clock::now();
  resp->set_ready(ready_());
  core_.RecordRpc("ServerReady", absl::OkStatus(), start);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* ctx,
                                                       const inference::ModelReadyRequest* req,
                                                       inference::ModelReadyResponse* resp) {
  // A model or version the server does not have is not ready: an answer, not an error, as
  // Triton's core gives it (its HTTP binding, like ours, then answers 400).
  return Unary(ctx, "ModelReady", [&](const std::string& tenant) {
    const bool exists =
        oip::CheckModelVersion(req->name(), req->version()).ok() &&
        (FindOp(req->name()) != nullptr || core_.graphs().Find(tenant, req->name()).ok());
    resp->set_ready(exists && ready_());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(grpc::CallbackServerContext* ctx,
                                                           const inference::ServerMetadataRequest*,
                                                           inference::ServerMetadataResponse* resp) {
  return Unary(ctx, "ServerMetadata", [&](const std::string&) {
    resp->set_name("opserve");
    resp->set_version(OPSERVE_VERSION);
    resp->add_extensions("system_shared_memory");
    if (core_.backend().name() == "cuda") resp->add_extensions("cuda_shared_memory");
    resp->add_extensions("opserve_saved_graphs");
    resp->add_extensions("opserve_stored_tensors");
    const Engine& engine = core_.engine();
    for (int i = 0; i < engine.num_devices(); ++i) {
      const MemoryStats m = engine.backend(i).Memory();
      const absl::Status serving = engine.Serving(i);
      inference::ServerDevice* d = resp->add_devices();
      d->set_name(engine.device_name(i));
      d->set_description(engine.backend(i).description());
      d->set_serving(serving.ok());
      d->set_error(std::string(serving.message()));
      d->set_memory_total(m.total);
      d->set_memory_budget(m.budget);
      d->set_memory_used(m.used);
    }
    return absl::OkStatus();
  });
}

absl::Status InferenceService::Metadata(const std::string& tenant, const std::string& name,
                                       const std::string& version,
                                       inference::ModelMetadataResponse* resp) {
  RETURN_IF_ERROR(oip::CheckModelVersion(name, version));
  resp->set_name(name);
  resp->add_versions("1");
  if (const OpSpec* op = FindOp(name); op != nullptr) {
    oip::OpMetadata(*op, core_.backend(), resp);
    return absl::OkStatus();
  }
  auto saved = core_.graphs().Find(tenant, name);
  if (!saved.ok()) return absl::NotFoundError(absl::StrCat("no model ", Quote(name)));
  oip::GraphMetadata(**saved, resp);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                          const inference::ModelMetadataRequest* req,
                                                          inference::ModelMetadataResponse* resp) {
  return Unary(ctx, "ModelMetadata", [&](const std::string& tenant) {
    return Metadata(tenant, req->name(), req->version(), resp);
  });
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(grpc::CallbackServerContext* ctx,
                                                        const inference::ModelConfigRequest* req,
                                                        inference::ModelConfigResponse* resp) {
  return Unary(ctx, "ModelConfig", [&](const std::string& tenant) -> absl::Status {
    inference::ModelMetadataResponse meta;
    RETURN_IF_ERROR(Metadata(tenant, req->name(), req->version(), &meta));
    oip::ConfigFromMetadata(meta, core_.options().max_batch_size, resp->mutable_config());
    return absl::OkStatus();
  });
}

// One model's, or (no name) those of every model the caller can run: the ops and its own saved
// graphs, as RepositoryIndex lists them.
grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* ctx, const inference::ModelStatisticsRequest* req,
    inference::ModelStatisticsResponse* resp) {
  return Unary(ctx, "ModelStatistics", [&](const std::string& tenant) -> absl::Status {
    const std::string& name = req->name();
    if (name.empty()) {
      if (!req->version().empty() && req->version() != "1") {
        return absl::NotFoundError(absl::StrCat("no model has version ", Quote(req->version()),
                                                "; each model's one version is '1'"));
      }
      for (const OpSpec& op : Ops()) {
        stats_.Fill({tenant, std::string(op.name), nullptr}, resp->add_model_stats());
      }
      for (auto& [graph_name, g] : core_.graphs().List(tenant)) {
        stats_.Fill({tenant, graph_name, g}, resp->add_model_stats());
      }
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(oip::CheckModelVersion(name, req->version()));
    if (FindOp(name) != nullptr) {
      stats_.Fill({tenant, name, nullptr}, resp->add_model_stats());
      return absl::OkStatus();
    }
    auto saved = core_.graphs().Find(tenant, name);
    if (!saved.ok()) return absl::NotFoundError(absl::StrCat("no model ", Quote(name)));
    stats_.Fill({tenant, name, *saved}, resp->add_model_stats());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* ctx, const inference::RepositoryIndexRequest*,
    inference::RepositoryIndexResponse* resp) {
  return Unary(ctx, "RepositoryIndex", [&](const std::string& tenant) {
    const bool ready = ready_();
    auto add = [&](const std::string& name) {
      auto* m = resp->add_models();
      m->set_name(name);
      m->set_version("1");
      m->set_state(ready ? "READY" : "UNAVAILABLE");
      if (!ready) m->set_reason("the server is draining or its device failed");
    };
    for (const OpSpec& op : Ops()) add(std::string(op.name));
    for (const auto& [name, g] : core_.graphs().List(tenant)) add(name);
    return absl::OkStatus();
  });
}

// ---- System shared memory ----

grpc::ServerUnaryReactor* InferenceService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryStatusRequest* req,
    inference::SystemSharedMemoryStatusResponse* resp) {
  return Unary(ctx, "SystemSharedMemoryStatus", [&](const std::string& tenant) -> absl::Status {
    auto listed = regions().system.List(tenant, req->name());
    if (!req->name().empty() && listed.empty()) {
      return absl::NotFoundError(absl::StrCat("no system shared memory region ", Quote(req->name())));
    }
    for (const auto& [name, r] : listed) {
      auto& status = (*resp->mutable_regions())[name];
      status.set_name(name);
      status.set_key(r->key());
      status.set_offset(r->offset());
      status.set_byte_size(r->byte_size());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryRegisterRequest* req,
    inference::SystemSharedMemoryRegisterResponse*) {
  return Unary(ctx, "SystemSharedMemoryRegister", [&](const std::string& tenant) -> absl::Status {
    RETURN_IF_ERROR(CheckTensorName(req->name(), "system shared memory region"));
    // Checked before the mapping, whose registration with the device takes a while.
    if (regions().system.Find(tenant, req->name()).ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("system shared memory region ", Quote(req->name()), " is already registered"));
    }
    ASSIGN_OR_RETURN(auto region,
                     SystemRegion::Map(core_.backend(), req->key(), req->offset(), req->byte_size()));
    return regions().system.Insert(tenant, req->name(), std::move(region));
  });
}

// A region that a request in flight uses is not unregistered (FAILED_PRECONDITION): the
// registry's reference is then not the only one.
template <typename Region>
absl::Status RefuseIfInUse(const std::string& name, const std::shared_ptr<Region>& region) {
  if (region.use_count() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory region ", Quote(name), " is in use by a request in flight; unregister it "
        "once that request is answered"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* InferenceService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::SystemSharedMemoryUnregisterRequest* req,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return Unary(ctx, "SystemSharedMemoryUnregister", [&](const std::string& tenant) {
    return regions().system.Erase(tenant, req->name(), RefuseIfInUse<SystemRegion>).status();
  });
}

// ---- CUDA shared memory ----

grpc::ServerUnaryReactor* InferenceService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryStatusRequest* req,
    inference::CudaSharedMemoryStatusResponse* resp) {
  return Unary(ctx, "CudaSharedMemoryStatus", [&](const std::string& tenant) -> absl::Status {
    RETURN_IF_ERROR(NeedsCuda(core_.backend()));
    auto listed = regions().cuda.List(tenant, req->name());
    if (!req->name().empty() && listed.empty()) {
      return absl::NotFoundError(absl::StrCat("no CUDA shared memory region ", Quote(req->name())));
    }
    for (const auto& [name, r] : listed) {
      auto& status = (*resp->mutable_regions())[name];
      status.set_name(name);
      status.set_device_id(static_cast<uint64_t>(r->device_id));
      status.set_byte_size(r->byte_size);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryRegisterRequest* req,
    inference::CudaSharedMemoryRegisterResponse*) {
  return Unary(ctx, "CudaSharedMemoryRegister", [&](const std::string& tenant) -> absl::Status {
    RETURN_IF_ERROR(NeedsCuda(core_.backend()));
    RETURN_IF_ERROR(CheckTensorName(req->name(), "CUDA shared memory region"));
    if (regions().cuda.Find(tenant, req->name()).ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("CUDA shared memory region ", Quote(req->name()), " is already registered"));
    }
    if (req->byte_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA shared memory region ",
                                                     Quote(req->name()), ": byte_size is 0"));
    }
    auto region = std::make_shared<CudaRegion>();
    region->device_id = req->device_id();
    region->byte_size = req->byte_size();
    // The GPU the handle was made on, among those served (its name is its ordinal here).
    const std::string what = absl::StrCat("CUDA shared memory region ", Quote(req->name()));
    absl::StatusOr<int> device =
        core_.engine().FindDevice(absl::StrCat("cuda:", req->device_id()), what);
    if (device.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": device ", req->device_id(), " is not a GPU this server serves (",
          absl::StrJoin(core_.engine().device_names(), ", "), ")"));
    }
    ASSIGN_OR_RETURN(region->engine_device, device);
    auto buffer = core_.engine().backend(region->engine_device)
                      .OpenSharedDeviceMemory(req->raw_handle(), req->device_id(), req->byte_size());
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("CUDA shared memory region ", Quote(req->name()), ": ",
                                       buffer.status().message()));
    }
    region->buffer = *std::move(buffer);
    return regions().cuda.Insert(tenant, req->name(), std::move(region));
  });
}

grpc::ServerUnaryReactor* InferenceService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* ctx, const inference::CudaSharedMemoryUnregisterRequest* req,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return Unary(ctx, "CudaSharedMemoryUnregister", [&](const std::string& tenant) {
    RETURN_IF_ERROR(NeedsCuda(core_.backend()));
    return regions().cuda.Erase(tenant, req->name(), RefuseIfInUse<CudaRegion>).status();
  });
}

}  // namespace opserve
