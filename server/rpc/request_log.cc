#include "server/rpc/request_log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "inference/grpc_service.grpc.pb.h"
#include "opserve/v1/opserve.grpc.pb.h"
#include "server/rpc/request_parsing.h"

namespace opserve {
namespace {

using grpc::experimental::InterceptionHookPoints;
using Clock = std::chrono::steady_clock;
using Tokens = std::map<std::string, std::string>;

// The model or graph a request names: its `model_name`, or the `name` of a request about a model
// or a saved graph (ModelMetadata, SaveGraph); tensor names are not logged.
std::string NameOf(std::string_view method, const google::protobuf::Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::FieldDescriptor* f = d->FindFieldByName("model_name");
  if (f == nullptr &&
      (method.find("Model") != method.npos || method.find("Graph") != method.npos)) {
    f = d->FindFieldByName("name");
  }
  if (f == nullptr || f->is_repeated() ||
      f->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
    return "";
  }
  return m.GetReflection()->GetString(m, f);
}

// The tenant of the call's bearer token, as ServerCore::Authenticate finds it; "" when there is
// none to name.
std::string TenantOf(const Tokens& tokens, const grpc::ServerContextBase& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return "";
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  if (!value.starts_with(kBearer)) return "";
  auto tenant = tokens.find(std::string(value.substr(kBearer.size())));
  return tenant == tokens.end() ? "" : tenant->second;
}

// Printed so that a value never breaks the line into fields and never floods the log: a client
// chooses names.
constexpr size_t kMaxFieldChars = 128;

std::string Field(std::string_view value) {
  if (value.empty()) return "-";
  std::string out;
  for (char c : value.substr(0, kMaxFieldChars)) {
    const bool plain = c > ' ' && c < 0x7f && c != '"' && c != '\\';
    out += plain ? std::string(1, c) : absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
  }
  if (value.size() > kMaxFieldChars) out += "...";
  return out;
}

class CallLog final : public grpc::experimental::Interceptor {
 public:
  CallLog(grpc::experimental::ServerRpcInfo* info, std::string_view method, const Tokens& tokens)
      : info_(info), method_(method), tokens_(tokens) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      // nullptr at the end of a client stream.
      if (const void* msg = m->GetRecvMessage(); msg != nullptr) {
        const auto* received = static_cast<const ReceivedMessage*>(msg);
        request_bytes_ += received->wire_bytes;
        std::lock_guard<std::mutex> lock(mu_);
        if (name_.empty() && received->proto != nullptr) name_ = NameOf(method_, *received->proto);
      }
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // Serializes the response here instead of later in the same send: no second copy.
      if (const grpc::ByteBuffer* sent = m->GetSerializedSendMessage(); sent != nullptr) {
        response_bytes_ += sent->Length();
      }
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Print(m->GetSendStatus().error_code());
    }
    m->Proceed();
  }

 private:
  void Print(grpc::StatusCode code) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
    grpc::ServerContextBase* ctx = info_->server_context();
    std::lock_guard<std::mutex> lock(mu_);
    const std::string line = absl::StrFormat(
        "opserve: request method=%s name=%s tenant=%s code=%s ms=%.3f request_bytes=%u "
        "response_bytes=%u peer=%s\n",
        method_, Field(name_), Field(TenantOf(tokens_, *ctx)),
        absl::StatusCodeToString(static_cast<absl::StatusCode>(code)), ms, request_bytes_.load(),
        response_bytes_.load(), Field(ctx->peer()));
    // One write per line: lines of concurrent calls do not interleave.
    std::fwrite(line.data(), 1, line.size(), stderr);
  }

  grpc::experimental::ServerRpcInfo* const info_;
  const std::string_view method_;
  const Tokens& tokens_;
  const Clock::time_point start_ = Clock::now();
  // A stream's reads and writes may be intercepted on different threads at once.
  std::mutex mu_;
  std::string name_;  // guarded by mu_
  std::atomic<uint64_t> request_bytes_{0};
  std::atomic<uint64_t> response_bytes_{0};
};

class RequestLogFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestLogFactory(Tokens tokens) : tokens_(std::move(tokens)) {}

  // Only the methods of opserve's two services, whose messages are ReceivedMessages; the health
  // and reflection services are left alone (nullptr: no interceptor for that call).
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const std::string_view path = info->method();  // "/opserve.v1.OpServe/Execute"
    for (std::string_view service :
         {v1::OpServe::service_full_name(), inference::GRPCInferenceService::service_full_name()}) {
      if (path.size() > service.size() + 2 && path[0] == '/' &&
          path.substr(1, service.size()) == service && path[service.size() + 1] == '/') {
        return new CallLog(info, path.substr(service.size() + 2), tokens_);
      }
    }
    return nullptr;
  }

 private:
  const Tokens tokens_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRequestLog(
    std::map<std::string, std::string> tokens) {
  return std::make_unique<RequestLogFactory>(std::move(tokens));
}

}  // namespace opserve
