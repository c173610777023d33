#include "server/http/endpoints.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/infer_body.h"
#include "server/http/json_proto.h"
#include "server/http/lent_call.h"

namespace opserve::http {
namespace {

using inference::GRPCInferenceService;
using Stub = GRPCInferenceService::Stub;

std::string Json(const google::protobuf::Message& m) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  WriteMessage(m, w);
  return std::string(buffer.GetString(), buffer.GetSize());
}

// Messages as a JSON array: Triton's repository index answers a list of models, its
// shared-memory status answers a list of regions (a map's values).
template <typename Messages>
std::string JsonArray(const Messages& messages) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  w.StartArray();
  for (const auto& v : messages) WriteMessage(v, w);
  w.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

template <typename Map>
std::vector<typename Map::mapped_type> Values(const Map& map) {
  std::vector<typename Map::mapped_type> values;
  for (const auto& entry : map) values.push_back(entry.second);
  return values;
}

// Calls `rpc` with `req` for the request in `ex`; on success hands the response to `answer`,
// on failure answers the error.
template <typename Req, typename Resp, typename Answer>
void Call(Exchange& ex, grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
          Stub& stub, const Req& req, Answer answer) {
  Resp resp;
  auto ctx = ex.CallContext();
  const grpc::Status s = (stub.*rpc)(ctx.get(), req, &resp);
  if (!s.ok()) return ex.ReplyError(s);
  answer(resp);
}

// A request body read into `req` (the register and index requests); false once it answered.
bool ReadBody(Exchange& ex, absl::string_view what, google::protobuf::Message* req) {
  absl::StatusOr<std::string> body = ex.ReadAll();
  absl::Status s = body.ok() ? ReadMessage(*body, what, req) : body.status();
  if (!s.ok()) ex.ReplyError(s);
  return s.ok();
}

void Infer(const Route& route, Exchange& ex, grpc::GenericStub& generic) {
  absl::StatusOr<uint64_t> length = ex.BodyLength();
  if (!length.ok()) return ex.ReplyError(length.status());
  uint64_t header_bytes = *length;
  if (const std::string h = ex.Header("Inference-Header-Content-Length"); !h.empty()) {
    if (!absl::SimpleAtoi(h, &header_bytes) || header_bytes > *length) {
      return ex.ReplyError(absl::InvalidArgumentError(absl::StrCat(
          "Inference-Header-Content-Length is '", h, "'; the body has ", *length, " bytes")));
    }
  }
  std::string header;
  InferHttpRequest req;
  req.message.set_model_name(route.model);
  req.message.set_model_version(route.version);
  absl::Status s = ex.Read(header_bytes, &header);
  if (s.ok()) {
    s = InferRequestFromHttp(
        header, *length - header_bytes, [&ex](char* dst, uint64_t n) { return ex.Read(dst, n); },
        &req);
  }
  if (!s.ok()) return ex.ReplyError(s);
  inference::ModelInferResponse resp;
  auto ctx = ex.CallContext();
  if (grpc::Status g = LentModelInfer(generic, ctx.get(), req, &resp); !g.ok()) {
    return ex.ReplyError(g);
  }
  {
    std::string json;
    std::vector<std::string_view> binary;
    if (absl::Status s = InferResponseToHttp(resp, req, &json, &binary); !s.ok()) {
      return ex.ReplyError(s);
    }
    if (binary.empty()) return ex.ReplyJson(json);
    ex.Reply(200, "application/octet-stream", json, binary,
             {{"Inference-Header-Content-Length", absl::StrCat(json.size())}});
  }
}

}  // namespace

void Serve(const Route& route, Exchange& ex, Stub& stub, grpc::GenericStub& generic) {
  auto ok_if = [&ex](bool yes) { ex.ReplyStatus(yes ? 200 : 400); };
  switch (route.endpoint) {
    case Endpoint::kServerLive:
      return Call(ex, &Stub::ServerLive, stub, inference::ServerLiveRequest(),
                  [&](const auto& r) { ok_if(r.live()); });
    case Endpoint::kServerReady:
      return Call(ex, &Stub::ServerReady, stub, inference::ServerReadyRequest(),
                  [&](const auto& r) { ok_if(r.ready()); });
    case Endpoint::kServerMetadata:
      return Call(ex, &Stub::ServerMetadata, stub, inference::ServerMetadataRequest(),
                  [&](inference::ServerMetadataResponse r) {
                    r.add_extensions("binary_tensor_data");  // this binding's own
                    ex.ReplyJson(Json(r));
                  });
    case Endpoint::kModelReady: {
      inference::ModelReadyRequest req;
      req.set_name(route.model);
      req.set_version(route.version);
      return Call(ex, &Stub::ModelReady, stub, req, [&](const auto& r) { ok_if(r.ready()); });
    }
    case Endpoint::kModelMetadata: {
      inference::ModelMetadataRequest req;
      req.set_name(route.model);
      req.set_version(route.version);
      return Call(ex, &Stub::ModelMetadata, stub, req,
                  [&](const auto& r) { ex.ReplyJson(Json(r)); });
    }
    case Endpoint::kModelConfig: {
      inference::ModelConfigRequest req;
      req.set_name(route.model);
      req.set_version(route.version);
      return Call(ex, &Stub::ModelConfig, stub, req,
                  [&](const auto& r) { ex.ReplyJson(Json(r.config())); });
    }
    case Endpoint::kModelStatistics: {
      inference::ModelStatisticsRequest req;
      req.set_name(route.model);
      req.set_version(route.version);
      return Call(ex, &Stub::ModelStatistics, stub, req,
                  [&](const auto& r) { ex.ReplyJson(Json(r)); });
    }
    case Endpoint::kModelInfer:
      return Infer(route, ex, generic);
    case Endpoint::kRepositoryIndex: {
      inference::RepositoryIndexRequest req;
      if (!ReadBody(ex, "repository index request", &req)) return;
      return Call(ex, &Stub::RepositoryIndex, stub, req,
                  [&](const auto& r) { ex.ReplyJson(JsonArray(r.models())); });
    }
    case Endpoint::kSharedMemoryStatus:
      if (route.cuda) {
        inference::CudaSharedMemoryStatusRequest req;
        req.set_name(route.region);
        return Call(ex, &Stub::CudaSharedMemoryStatus, stub, req,
                    [&](const auto& r) { ex.ReplyJson(JsonArray(Values(r.regions()))); });
      } else {
        inference::SystemSharedMemoryStatusRequest req;
        req.set_name(route.region);
        return Call(ex, &Stub::SystemSharedMemoryStatus, stub, req,
                    [&](const auto& r) { ex.ReplyJson(JsonArray(Values(r.regions()))); });
      }
    case Endpoint::kSharedMemoryRegister:
      if (route.cuda) {
        inference::CudaSharedMemoryRegisterRequest req;
        if (!ReadBody(ex, "CUDA shared memory register request", &req)) return;
        req.set_name(route.region);
        return Call(ex, &Stub::CudaSharedMemoryRegister, stub, req,
                    [&](const auto&) { ex.ReplyStatus(200); });
      } else {
        inference::SystemSharedMemoryRegisterRequest req;
        if (!ReadBody(ex, "system shared memory register request", &req)) return;
        req.set_name(route.region);
        return Call(ex, &Stub::SystemSharedMemoryRegister, stub, req,
                    [&](const auto&) { ex.ReplyStatus(200); });
      }
    case Endpoint::kSharedMemoryUnregister:
      if (route.cuda) {
        inference::CudaSharedMemoryUnregisterRequest req;
        req.set_name(route.region);
        return Call(ex, &Stub::CudaSharedMemoryUnregister, stub, req,
                    [&](const auto&) { ex.ReplyStatus(200); });
      } else {
        inference::SystemSharedMemoryUnregisterRequest req;
        req.set_name(route.region);
        return Call(ex, &Stub::SystemSharedMemoryUnregister, stub, req,
                    [&](const auto&) { ex.ReplyStatus(200); });
      }
    // The RPCs answer UNIMPLEMENTED naming themselves: their request bodies are not read.
    case Endpoint::kRepositoryModelLoad: {
      inference::RepositoryModelLoadRequest req;
      req.set_model_name(route.model);
      return Call(ex, &Stub::RepositoryModelLoad, stub, req,
                  [&](const auto&) { ex.ReplyStatus(200); });
    }
    case Endpoint::kRepositoryModelUnload: {
      inference::RepositoryModelUnloadRequest req;
      req.set_model_name(route.model);
      return Call(ex, &Stub::RepositoryModelUnload, stub, req,
                  [&](const auto&) { ex.ReplyStatus(200); });
    }
    case Endpoint::kTraceSetting: {
      inference::TraceSettingRequest req;
      req.set_model_name(route.model);
      return Call(ex, &Stub::TraceSetting, stub, req,
                  [&](const auto& r) { ex.ReplyJson(Json(r)); });
    }
    case Endpoint::kLogSettings:
      return Call(ex, &Stub::LogSettings, stub, inference::LogSettingsRequest(),
                  [&](const auto& r) { ex.ReplyJson(Json(r)); });
  }
}

}  // namespace opserve::http
