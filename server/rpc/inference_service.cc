#include "server/rpc/inference_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/oip_convert.h"

#ifndef OPSERVE_VERSION
#define OPSERVE_VERSION "unknown"
#endif

namespace opserve {
namespace {

// The metadata of an op model, from the table: each input with the first dtype the device runs
// and the rank of the op's typical shapes, every dimension -1; the output as the op infers it.
void OpMetadata(const OpSpec& op, const Backend& backend, inference::ModelMetadataResponse* resp) {
  resp->set_platform("opserve_op");
  const std::vector<DType> dtypes = DTypesFor(op.name, backend);
  const DType dtype = dtypes.empty() ? DType::kFloat32 : dtypes.front();
  // The typical case of the highest rank (sum takes any rank; [] would read as a scalar).
  const std::vector<std::vector<int64_t>>* best = &op.test.small_shapes.front();
  for (const auto& c : op.test.small_shapes) {
    if (c.front().size() > best->front().size()) best = &c;
  }
  const std::vector<std::vector<int64_t>>& shapes = *best;
  const std::span<const absl::string_view> names = oip::OpInputNames(op);
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < names.size(); ++i) {
    auto* in = resp->add_inputs();
    in->set_name(std::string(names[i]));
    in->set_datatype(std::string(OipName(dtype)));
    for (size_t d = 0; d < shapes[i].size(); ++d) in->add_shape(-1);
    metas.push_back(TensorMeta{dtype, shapes[i]});
  }
  auto* out = resp->add_outputs();
  out->set_name(std::string(oip::kOpOutputName));
  if (auto meta = op.infer(metas); meta.ok()) {
    out->set_datatype(std::string(OipName(meta->dtype)));
    for (size_t d = 0; d < meta->shape.size(); ++d) out->add_shape(-1);
  }
}

// The CUDA shared-memory extension exists on the CUDA backend only (ServerMetadata says so).
absl::Status NeedsCuda(const Backend& backend) {
  if (backend.name() == "cuda") return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "CUDA shared memory needs the CUDA backend; this server runs on ", backend.device()));
}

void GraphTensorMetadata(const v1::GraphTensor& t,
                         inference::ModelMetadataResponse::TensorMetadata* m) {
  m->set_name(t.name());
  m->set_datatype(std::string(OipName(static_cast<DType>(t.dtype()))));
  *m->mutable_shape() = t.shape();
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
  ParseUnary("RepositoryIndex", &InferenceService::RepositoryIndex);
  ParseUnary("SystemSharedMemoryStatus", &InferenceService::SystemSharedMemoryStatus);
  ParseUnary("SystemSharedMemoryRegister", &InferenceService::SystemSharedMemoryRegister);
  ParseUnary("SystemSharedMemoryUnregister", &InferenceService::SystemSharedMemoryUnregister);
  ParseUnary("CudaSharedMemoryStatus", &InferenceService::CudaSharedMemoryStatus);
  ParseUnary("CudaSharedMemoryRegister", &InferenceService::CudaSharedMemoryRegister);
  ParseUnary("CudaSharedMemoryUnregister", &InferenceService::CudaSharedMemoryUnregister);
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
  resp->set_live(true);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* ctx,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* resp) {
  resp->set_ready(ready_());
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* ctx,
                                                       const inference::ModelReadyRequest* req,
                                                       inference::ModelReadyResponse* resp) {
  return Unary(ctx, "ModelReady", [&](const std::string& tenant) -> absl::Status {
    RETURN_IF_ERROR(oip::CheckModelVersion(req->name(), req->version()));
    if (FindOp(req->name()) == nullptr) {
      auto saved = core_.graphs().Find(tenant, req->name());
      if (!saved.ok()) return absl::NotFoundError(absl::StrCat("no model ", Quote(req->name())));
    }
    resp->set_ready(ready_());
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

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(grpc::CallbackServerContext* ctx,
                                                          const inference::ModelMetadataRequest* req,
                                                          inference::ModelMetadataResponse* resp) {
  return Unary(ctx, "ModelMetadata", [&](const std::string& tenant) -> absl::Status {
    RETURN_IF_ERROR(oip::CheckModelVersion(req->name(), req->version()));
    resp->set_name(req->name());
    resp->add_versions("1");
    if (const OpSpec* op = FindOp(req->name()); op != nullptr) {
      OpMetadata(*op, core_.backend(), resp);
      return absl::OkStatus();
    }
    auto saved = core_.graphs().Find(tenant, req->name());
    if (!saved.ok()) return absl::NotFoundError(absl::StrCat("no model ", Quote(req->name())));
    resp->set_platform("opserve_graph");
    for (const auto& t : (*saved)->info.inputs()) GraphTensorMetadata(t, resp->add_inputs());
    for (const auto& t : (*saved)->info.outputs()) GraphTensorMetadata(t, resp->add_outputs());
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
