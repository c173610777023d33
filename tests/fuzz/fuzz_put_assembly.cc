// Fuzz target: the assembly of PutTensor chunk sequences, driven the way the
// PutTensor reactor drives it: messages in order until one fails, then Commit when the stream
// ended cleanly, or nothing when the client walked away.
//
// Input layout:
//   byte 0        flags: bit 0 set = abandon (no Commit; the client disconnected),
//                        bit 1 set = the caller's namespace is "tenant" instead of "".
//   then, repeated: a 2-byte little-endian length L and L bytes of a serialized PutTensorRequest
//   (L is clipped to what is left). Bytes that do not parse end the stream as gRPC would: a
//   failed read, so an abandoned upload.
//
// Each input gets a fresh CPU backend (a small budget, so that Reserve fails too) and a store
// seeded with a tensor per namespace. Invariants:
//   - on any failure, or an abandoned stream, the store holds exactly what it held before, and
//     once the assembly is destroyed the budget's used bytes are back to the pre-call value;
//   - on success, the store holds the header's name, dtype and shape with exactly the bytes the
//     chunks carried, in the caller's namespace only; the budget grew by the tensor's bytes (less
//     the bytes of a tensor it replaced, once that is released); other tensors are untouched;
//   - received() counts the accepted chunk bytes; errors carry INVALID_ARGUMENT,
//     RESOURCE_EXHAUSTED or ALREADY_EXISTS and a message.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/device.h"
#include "server/engine/engine.h"
#include "server/rpc/put_assembly.h"
#include "server/engine/tensor_store.h"
#include "tests/fuzz/fuzz_check.h"

namespace opserve {
namespace {

constexpr size_t kMaxInputBytes = 1 << 20;
// The budget sits below max_tensor_bytes so that a header can pass CheckMeta and still fail to
// reserve its buffer.
constexpr uint64_t kBudgetBytes = 48 << 10;
constexpr uint64_t kMaxTensorBytes = 64 << 10;
constexpr char kTenant[] = "tenant";

// NOT_FOUND: a header naming a shared-memory region, of which the registry here has none.
const absl::StatusCode kMessageRefusals[] = {absl::StatusCode::kInvalidArgument,
                                             absl::StatusCode::kResourceExhausted,
                                             absl::StatusCode::kAlreadyExists,
                                             absl::StatusCode::kNotFound};
// Commit after accepted messages: only a byte count that does not match. ALREADY_EXISTS would
// mean the name was taken after the header's check, which nothing here does.
const absl::StatusCode kCommitRefusals[] = {absl::StatusCode::kInvalidArgument};

using Snapshot = std::map<std::pair<std::string, std::string>, StoredTensorPtr>;  // (ns, name)

Snapshot Take(const TensorStore& store) {
  Snapshot s;
  for (const std::string ns : {"", kTenant}) {
    for (StoredTensorPtr& t : store.List(ns)) s[{ns, t->name}] = std::move(t);
  }
  return s;
}

std::string Describe(const Snapshot& s) {
  std::string out;
  for (const auto& [key, t] : s) absl::StrAppend(&out, "'", key.first, "'/", key.second, " ");
  return out;
}

void Seed(Backend& backend, TensorStore& store, const std::string& name, DType dtype,
          std::vector<int64_t> shape, const std::string& ns) {
  TensorMeta meta{dtype, std::move(shape)};
  BufferPtr buffer = *backend.Allocate(meta.Bytes());
  std::memset(buffer->data(), 0x5a, meta.Bytes());
  auto t = std::make_shared<StoredTensor>(StoredTensor{name, std::move(meta), std::move(buffer)});
  if (!store.InsertAll({t}, {false}, ns).ok()) std::abort();
}

}  // namespace
}  // namespace opserve

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  opserve::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserve;
  if (size < 1 || size > kMaxInputBytes) return 0;
  const bool abandon = data[0] & 1;
  const std::string ns = (data[0] & 2) ? kTenant : "";

  // A device of its own (PutAssembly places through an engine), with no thread polling.
  std::unique_ptr<Device> device = *Device::Start(MakeCpuBackend(kBudgetBytes), /*lanes=*/1,
                                                  /*max_queue=*/1, std::chrono::microseconds(0),
                                                  nullptr, /*completion_threads=*/1, /*contexts=*/1);
  Backend* const backend = &device->backend();
  TensorStore store;
  Device* devices[] = {device.get()};
  Engine engine(devices, store, nullptr, nullptr, EngineOptions{});
  Seed(*backend, store, "A", DType::kFloat32, {2, 3}, "");
  Seed(*backend, store, "B", DType::kInt32, {4}, kTenant);
  const Limits limits{kMaxTensorBytes, /*max_graph_nodes=*/16, /*max_message_bytes=*/4 << 20};

  Snapshot before = Take(store);
  const uint64_t used_before = backend->Memory().used;

  bool failed = false;    // a message or the commit was refused
  bool committed = false;
  v1::PutTensorHeader header;  // the first header accepted
  std::string chunks;          // every accepted chunk, in order
  v1::TensorInfo info;
  {
    SharedMemoryRegistry regions;  // none registered
    PutAssembly assembly(engine, limits, ns, &regions);
    size_t pos = 1;
    bool stream_broke = false;
    while (pos + 2 <= size) {
      size_t len = data[pos] | (static_cast<size_t>(data[pos + 1]) << 8);
      pos += 2;
      len = std::min(len, size - pos);
      v1::PutTensorRequest msg;
      if (!msg.ParseFromArray(data + pos, static_cast<int>(len))) {
        stream_broke = true;
        break;
      }
      pos += len;
      const absl::Status s = assembly.OnMessage(msg);
      if (!s.ok()) {
        FUZZ_CHECK(fuzz::ErrorIsOneOf(s, kMessageRefusals), s.ToString());
        failed = true;
        break;
      }
      if (msg.has_header()) header = msg.header();
      if (msg.has_chunk()) chunks += msg.chunk();
      FUZZ_CHECK(assembly.received() == chunks.size(),
                 absl::StrCat("received() ", assembly.received(), ", chunks carried ", chunks.size()));
      // Nothing is visible before Commit.
      FUZZ_CHECK(Take(store) == before, "the store changed mid-upload: " + Describe(Take(store)));
    }
    if (!failed && !stream_broke && !abandon) {
      const absl::Status s = assembly.Commit(&info);
      if (s.ok()) {
        committed = true;
      } else {
        FUZZ_CHECK(fuzz::ErrorIsOneOf(s, kCommitRefusals), s.ToString());
        failed = true;
      }
    }
    if (!committed) {
      FUZZ_CHECK(Take(store) == before, "a failed upload changed the store: " + Describe(Take(store)));
    }
  }

  if (!committed) {
    FUZZ_CHECK(Take(store) == before, "the store changed after a failed upload");
    FUZZ_CHECK(backend->Memory().used == used_before,
               absl::StrCat("budget leak: ", used_before, " bytes used before, ",
                            backend->Memory().used, " after a failed or abandoned upload"));
    return 0;
  }

  // Committed: exactly one entry changed, the header's name in the caller's namespace.
  TensorMeta meta{static_cast<DType>(header.dtype()), {header.shape().begin(), header.shape().end()}};
  FUZZ_CHECK(CheckTensorName(header.name(), "name").ok(), header.name());
  FUZZ_CHECK(CheckMeta(meta, kMaxTensorBytes, "meta").ok(), meta.DebugString());
  FUZZ_CHECK(chunks.size() == meta.Bytes(),
             absl::StrCat("committed ", chunks.size(), " bytes for ", meta.DebugString()));
  FUZZ_CHECK(info.name() == header.name() && info.bytes() == meta.Bytes() &&
                 info.dtype() == header.dtype() && info.shape_size() == header.shape_size(),
             info.ShortDebugString());
  Snapshot after = Take(store);
  const auto key = std::make_pair(ns, header.name());
  const bool replaced = before.count(key) > 0;
  FUZZ_CHECK(!replaced || header.overwrite(), "replaced '" + header.name() + "' without overwrite");
  FUZZ_CHECK(after.size() == before.size() + (replaced ? 0 : 1), Describe(after));
  for (const auto& [k, t] : before) {
    if (k != key) FUZZ_CHECK(after.count(k) && after[k] == t, "tensor " + k.second + " changed");
  }
  const StoredTensorPtr& t = after[key];
  FUZZ_CHECK(t != nullptr && t->name == header.name() && t->meta == meta, Describe(after));
  std::string stored(meta.Bytes(), '\0');
  FUZZ_CHECK(backend->CopyOut(*t->buffer, 0, stored.data(), stored.size()).ok(), "CopyOut");
  FUZZ_CHECK(stored == chunks, "the stored bytes differ from the chunks sent");

  // While `before` still holds a replaced tensor, both buffers are charged.
  FUZZ_CHECK(backend->Memory().used == used_before + meta.Bytes(),
             absl::StrCat(backend->Memory().used, " used, expected ", used_before, " + ", meta.Bytes()));
  const uint64_t replaced_bytes = replaced ? before[key]->meta.Bytes() : 0;
  before.clear();
  after.clear();
  FUZZ_CHECK(backend->Memory().used == used_before + meta.Bytes() - replaced_bytes,
             absl::StrCat(backend->Memory().used, " used after release, expected ", used_before,
                          " + ", meta.Bytes(), " - ", replaced_bytes));
  return 0;
}
