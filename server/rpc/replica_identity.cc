#include "server/rpc/replica_identity.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/tensor_store.h"

namespace opserve {
namespace {

// RPCs whose success means the call stored something on this replica (Execute: only when the
// response lists a kept output).
enum class Storing { kNo, kAlways, kExecute };

Storing StoringOf(absl::string_view method) {
  if (method == "/opserve.v1.OpServe/PutTensor" || method == "/opserve.v1.OpServe/SaveGraph") {
    return Storing::kAlways;
  }
  if (method == "/opserve.v1.OpServe/Execute") return Storing::kExecute;
  return Storing::kNo;
}

class ReplicaInterceptor : public grpc::experimental::Interceptor {
 public:
  ReplicaInterceptor(ReplicaIdentity* identity, Storing storing)
      : identity_(identity), storing_(storing) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_INITIAL_METADATA)) {
      const auto* md = methods->GetRecvInitialMetadata();
      auto it = md->find(kSessionHeader);
      // An id longer than the record keeps is not kept: such a session is always "unknown".
      if (it != md->end() && it->second.size() <= SessionRecord::kMaxSessionBytes) {
        session_.assign(it->second.data(), it->second.size());
      }
    }
    if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_INITIAL_METADATA)) {
      std::string name = identity_->name();
      if (!name.empty()) methods->GetSendInitialMetadata()->emplace(kReplicaHeader, std::move(name));
    }
    if (storing_ == Storing::kExecute && !session_.empty() &&
        methods->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE)) {
      const auto* resp = static_cast<const v1::ExecuteResponse*>(methods->GetSendMessage());
      if (resp != nullptr && resp->stored_size() > 0) stored_ = true;
    }
    if (!session_.empty() && methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      OnStatus(methods);
    }
    methods->Proceed();
  }

 private:
  void OnStatus(grpc::experimental::InterceptorBatchMethods* methods) {
    const grpc::Status status = methods->GetSendStatus();
    if (status.ok()) {
      if (storing_ == Storing::kAlways || stored_) identity_->sessions().Add(session_);
      return;
    }
    if (status.error_code() != grpc::StatusCode::NOT_FOUND ||
        !absl::StrContains(status.error_message(), kNotStoredHere) ||
        identity_->sessions().Contains(session_)) {
      return;
    }
    const std::string name = identity_->name();
    methods->ModifySendStatus(grpc::Status(
        status.error_code(),
        absl::StrCat(status.error_message(), "; replica ", name,
                     " has never stored anything for this x-opserve-session, so if the session "
                     "stored tensors they were on a replica that is no longer reachable: put "
                     "them again"),
        status.error_details()));
    methods->GetSendTrailingMetadata()->emplace(kSessionUnknownTrailer, name);
  }

  ReplicaIdentity* const identity_;
  const Storing storing_;
  std::string session_;
  bool stored_ = false;
};

class ReplicaInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ReplicaInterceptorFactory(ReplicaIdentity* identity) : identity_(identity) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ReplicaInterceptor(identity_, StoringOf(info->method()));
  }

 private:
  ReplicaIdentity* const identity_;
};

}  // namespace

void SessionRecord::Add(const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(session); it != index_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.push_front(session);
  index_.emplace(session, order_.begin());
  if (order_.size() > capacity_) {
    index_.erase(order_.back());
    order_.pop_back();
  }
}

bool SessionRecord::Contains(const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(session);
  if (it == index_.end()) return false;
  order_.splice(order_.begin(), order_, it->second);
  return true;
}

size_t SessionRecord::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

void ReplicaIdentity::set_name(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  name_ = std::move(name);
}

std::string ReplicaIdentity::name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return name_;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ReplicaIdentity::InterceptorFactory() {
  return std::make_unique<ReplicaInterceptorFactory>(this);
}

std::string DefaultReplicaName(int port) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return absl::StrCat("port ", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace opserve
