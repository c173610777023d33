// Fuzz target: ParseLifting (server/rpc/lifted_parse.h), the parse that receives large tensor
// bytes into pool blocks instead of the message: ModelInferRequest's raw_input_contents ({7})
// and ExecuteRequest's inline tensor data ({2, 2, 3}, found by the map entry's key).
//
// Input layout: byte 0: bit 7 picks ExecuteRequest (set) or ModelInferRequest; bits 0-6 the size
// of the gRPC slices the rest arrives in (1 to 128 bytes, so that tags, varints and entries
// straddle slices). The rest is the wire data. Bytes fields of 8 bytes and more are lifted, so
// small inputs exercise the lifting path.
//
// Invariants:
//   - where protobuf refuses the bytes, ParseLifting refuses them too;
//   - where ParseLifting accepts them, protobuf accepts them, and the two messages are equal
//     (map entries compared in key order) once the lifted bytes are put back from their blocks,
//     which hold exactly the fields' bytes: by position for ModelInfer, by key (the last entry
//     with it) for Execute;
//   - every block goes back to the pool when the caller drops it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "tests/support/canonical_proto.h"
#include "inference/grpc_service.pb.h"
#include "opserve/v1/opserve.pb.h"
#include "server/rpc/lifted_parse.h"
#include "tests/fuzz/fuzz_check.h"

namespace opserve {
namespace {

constexpr size_t kMaxInputBytes = 1 << 16;
constexpr uint64_t kLiftBytes = 8;

using test_support::Canonical;

// Puts the lifted bytes back where the message left them empty.
void PutBack(const std::vector<LiftedEntry>& lifted, inference::ModelInferRequest* m) {
  FUZZ_CHECK(static_cast<int>(lifted.size()) == m->raw_input_contents_size(),
             "one lifted slot per raw_input_contents entry");
  for (size_t i = 0; i < lifted.size(); ++i) {
    if (lifted[i].block.empty()) continue;
    FUZZ_CHECK(m->raw_input_contents(i).empty(), "a lifted entry left bytes in the message");
    *m->mutable_raw_input_contents(i) = std::string(lifted[i].block.view());
  }
}

void PutBack(const std::vector<LiftedEntry>& lifted, v1::ExecuteRequest* m) {
  std::set<std::string> seen;
  for (auto it = lifted.rbegin(); it != lifted.rend(); ++it) {
    if (!seen.insert(it->key).second || it->block.empty()) continue;  // the last entry wins
    auto found = m->mutable_inline_tensors()->find(it->key);
    FUZZ_CHECK(found != m->mutable_inline_tensors()->end(), "a lifted key the message lacks");
    FUZZ_CHECK(found->second.data().empty(), "a lifted tensor left bytes in the message");
    found->second.set_data(std::string(it->block.view()));
  }
}

template <typename Message>
void Check(grpc::ByteBuffer* buffer, const std::string& wire, const LiftPath& path, ReceivePool& pool) {
  Message want;
  const bool protobuf_ok = want.ParseFromString(wire);
  Message got;
  std::vector<LiftedEntry> lifted;
  const bool ok = ParseLifting(buffer, path, pool, &got, &lifted, kLiftBytes);
  FUZZ_CHECK(!ok || protobuf_ok, "ParseLifting accepted bytes protobuf refuses");
  if (!ok) return;
  for (const LiftedEntry& e : lifted) {
    FUZZ_CHECK(e.block.empty() || e.block.bytes() >= kLiftBytes, "a field below the threshold was lifted");
  }
  PutBack(lifted, &got);
  FUZZ_CHECK(Canonical(got) == Canonical(want), "the lifted parse differs from protobuf's");
}

}  // namespace
}  // namespace opserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserve;
  if (size < 1 || size > kMaxInputBytes) return 0;
  static const std::shared_ptr<ReceivePool> pool = ReceivePool::Create(nullptr, 64 << 20);
  const bool execute = (data[0] & 0x80) != 0;
  const size_t slice = 1 + (data[0] & 0x7f);
  const std::string wire(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += slice) {
    slices.emplace_back(wire.data() + at, std::min(slice, wire.size() - at));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  if (execute) {
    Check<v1::ExecuteRequest>(&buffer, wire,
                              {v1::ExecuteRequest::kInlineTensorsFieldNumber, 2, v1::Tensor::kDataFieldNumber},
                              *pool);
  } else {
    Check<inference::ModelInferRequest>(
        &buffer, wire, {inference::ModelInferRequest::kRawInputContentsFieldNumber}, *pool);
  }
  FUZZ_CHECK(pool->blocks_in_use() == 0, "a block did not go back to the pool");
  return 0;
}
