// The malformed requests the soak mixes in, one row each: a name, the one status code the
// server must answer with, and how to send it (one RPC per row). The soak cycles through the
// whole table, so adding a row is all it takes to have it tried under load.
#pragma once

#include <span>
#include <string>

#include "absl/status/status.h"
#include "client/opserve_client.h"
#include "opserve/v1/opserve.grpc.pb.h"

namespace opserve::soak {

// The server's limits the soak starts it with; some rows step over them.
inline constexpr int kMaxGraphNodes = 16;
inline constexpr uint64_t kMemoryBudgetBytes = 256ull << 20;

struct MalformedContext {
  client::Client& client;
  v1::OpServe::Stub& stub;  // for streams the client library refuses to send
  std::string bad_prefix;   // names under it must never be stored: every request using one fails
  std::string anchor;       // a stored FLOAT32[4] tensor of this client, for name clashes
  absl::Duration timeout;   // deadline of each call
};

struct MalformedKind {
  const char* name;
  absl::StatusCode expected;
  absl::Status (*send)(MalformedContext& ctx);
};

std::span<const MalformedKind> MalformedKinds();

}  // namespace opserve::soak
