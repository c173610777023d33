// The parse of a request whose large `bytes` fields are copied from gRPC's slices straight into
// ReceivePool blocks (receive_pool.h says why) while protobuf parses the rest of the message.
//
// A LiftPath names where those fields are: field numbers from the top level down to a `bytes`
// field. ModelInfer's raw_input_contents is {7}, a top-level repeated field; Execute's inline
// tensors are {2, 2, 3}: the inline_tensors map's entries, their value (a Tensor), its data.
// For a top-level path each occurrence of the field on the wire gets one LiftedEntry, in wire
// order, found by position. For a path through a map each entry carries its key (field 1), and
// only the keys whose last entry was lifted are kept (protobuf keeps the last entry of a key),
// found by key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "server/rpc/receive_pool.h"

namespace opserve {

using LiftPath = std::vector<int>;

struct LiftedEntry {
  std::string key;           // a map entry's key; empty for a path that is not through a map
  ReceivePool::Block block;  // the bytes; empty where they stayed in the message
};

// Parses `buffer` as `message`, except that the `bytes` fields at `path` of at least
// `min_lift_bytes` go into blocks of `pool` (listed in `lifted`) and are left empty in the
// message. false when the bytes do not parse this way, when the message is too small to hold a
// field worth lifting, or when a field off the path is as large as a lifted one would be (a
// ModelInfer with 1 MiB of typed contents): the caller then parses them the ordinary way, which
// decides as protobuf does and says why.
bool ParseLifting(grpc::ByteBuffer* buffer, const LiftPath& path, ReceivePool& pool,
                  google::protobuf::Message* message, std::vector<LiftedEntry>* lifted,
                  uint64_t min_lift_bytes = ReceivePool::kMinLiftBytes);

// The lifted bytes of occurrence `i` of a top-level repeated field ({N} paths), else `entry`
// (the message's own bytes of that occurrence).
absl::string_view LiftedAt(const std::vector<LiftedEntry>& lifted, int i, const std::string& entry);

// The lifted bytes of the map entry with key `key` (the last one with it), if they were lifted.
std::optional<absl::string_view> LiftedByKey(const std::vector<LiftedEntry>& lifted,
                                             absl::string_view key);

}  // namespace opserve
