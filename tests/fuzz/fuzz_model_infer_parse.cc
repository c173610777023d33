// Fuzz target: ParseLifting (server/rpc/receive_pool.h), the parse of ModelInferRequest that
// receives large raw_input_contents entries into pool blocks instead of the message.
//
// Input layout: byte 0 picks the size of the gRPC slices the rest arrives in (1 to 256 bytes,
// so that tags, varints and entries straddle slices); the rest is the wire data. Entries of 8
// bytes and more are lifted, so small inputs exercise the lifting path.
//
// Invariants:
//   - where protobuf refuses the bytes, ParseLifting refuses them too;
//   - where ParseLifting accepts them, protobuf accepts them, and the two messages are equal
//     once the lifted entries are put back from their blocks (which hold exactly the entries'
//     bytes), map entries compared in key order;
//   - every block goes back to the pool when the caller drops it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "inference/grpc_service.pb.h"
#include "server/rpc/receive_pool.h"
#include "tests/fuzz/fuzz_check.h"

namespace opserve {
namespace {

constexpr size_t kMaxInputBytes = 1 << 16;
constexpr uint64_t kLiftBytes = 8;
constexpr int kField = inference::ModelInferRequest::kRawInputContentsFieldNumber;

// Map entries in key order: protobuf's default serialization follows the map's hash order,
// which two equal messages need not share.
std::string Canonical(const google::protobuf::Message& m) {
  std::string s;
  {
    google::protobuf::io::StringOutputStream sink(&s);
    google::protobuf::io::CodedOutputStream out(&sink);
    out.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&out);
  }
  return s;
}

}  // namespace
}  // namespace opserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserve;
  if (size < 1 || size > kMaxInputBytes) return 0;
  static const std::shared_ptr<ReceivePool> pool = ReceivePool::Create(nullptr, 64 << 20);
  const size_t slice = 1 + data[0];
  const std::string wire(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += slice) {
    slices.emplace_back(wire.data() + at, std::min(slice, wire.size() - at));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());

  inference::ModelInferRequest want;
  const bool protobuf_ok = want.ParseFromString(wire);
  {
    inference::ModelInferRequest got;
    std::vector<ReceivePool::Block> lifted;
    const bool ok = ParseLifting(&buffer, kField, *pool, &got, &lifted, kLiftBytes);
    FUZZ_CHECK(!ok || protobuf_ok, "ParseLifting accepted bytes protobuf refuses");
    if (ok) {
      FUZZ_CHECK(static_cast<int>(lifted.size()) == got.raw_input_contents_size(),
                 "one lifted slot per raw_input_contents entry");
      FUZZ_CHECK(got.raw_input_contents_size() == want.raw_input_contents_size(),
                 "as many entries as protobuf's parse");
      for (size_t i = 0; i < lifted.size(); ++i) {
        if (lifted[i].empty()) continue;
        FUZZ_CHECK(got.raw_input_contents(i).empty(), "a lifted entry left bytes in the message");
        FUZZ_CHECK(lifted[i].bytes() >= kLiftBytes, "an entry below the threshold was lifted");
        *got.mutable_raw_input_contents(i) = std::string(lifted[i].view());
      }
      FUZZ_CHECK(Canonical(got) == Canonical(want),
                 "the lifted parse differs from protobuf's");
    }
  }
  FUZZ_CHECK(pool->blocks_in_use() == 0, "a block did not go back to the pool");
  return 0;
}
