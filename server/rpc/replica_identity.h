// Which replica answered, and what a session that lost its replica is told.
//
// Behind a proxy that hashes `x-opserve-session` onto replicas (docs/DEPLOY.md), a session
// whose replica went away is hashed onto another one, which never held its tensors. Its
// NOT_FOUND then says so, naming this replica, instead of the plain "not stored on this
// server" that a deleted tensor gets. A gRPC server interceptor does it for every RPC, so no
// handler changes:
//   - every response carries the initial metadata `x-opserve-replica: <name>`;
//   - a call with `x-opserve-session` that stored something here (PutTensor, SaveGraph, an
//     Execute that kept an output) records the session, in a set of at most kMaxSessions, the
//     least recently seen dropped first;
//   - a NOT_FOUND for a stored tensor on a call whose session is not in that set keeps its code
//     and gets the explanation appended, and the trailing metadata
//     `x-opserve-session-unknown: <name>`, which clients test instead of parsing text.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

namespace opserve {

inline constexpr char kSessionHeader[] = "x-opserve-session";
inline constexpr char kReplicaHeader[] = "x-opserve-replica";
inline constexpr char kSessionUnknownTrailer[] = "x-opserve-session-unknown";

// The sessions that stored something on this replica: a bounded LRU set, shared by every call.
class SessionRecord {
 public:
  // Enough for every live session of a busy replica; the ids are at most kMaxSessionBytes each,
  // so the set stays under ~20 MiB. A session pushed out is told the longer message on its next
  // miss, which is still true of the tensors it misses.
  static constexpr size_t kMaxSessions = 1 << 16;
  static constexpr size_t kMaxSessionBytes = 128;

  explicit SessionRecord(size_t capacity = kMaxSessions) : capacity_(capacity) {}

  void Add(const std::string& session);
  bool Contains(const std::string& session);
  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // most recent first
  std::unordered_map<std::string, std::list<std::string>::iterator> index_;
};

// The replica's name, set once the port is known (before the first call is served is not
// guaranteed: a call that races the start sees the name empty and sends no header).
class ReplicaIdentity {
 public:
  void set_name(std::string name);
  std::string name() const;
  SessionRecord& sessions() { return sessions_; }

  // The interceptor factory to give grpc::ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();

 private:
  mutable std::mutex mu_;
  std::string name_;
  SessionRecord sessions_;
};

// "--replica_name", else "<hostname>:<port>".
std::string DefaultReplicaName(int port);

}  // namespace opserve
