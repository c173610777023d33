// Where tensors and requests go among the node's devices, and the copies between devices that
// placement implies: a new tensor goes where the most budget is free; a graph runs where most of
// its stored input bytes live, the rest copied there; a graph of inline inputs only runs on the
// least-loaded device.
#include <algorithm>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/engine.h"

namespace opserve {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

absl::StatusOr<int> Engine::PlaceNew() const {
  int best = -1;
  uint64_t best_free = 0;
  for (int i = 0; i < num_devices(); ++i) {
    if (!Serving(i).ok()) continue;
    const MemoryStats m = backend(i).Memory();
    const uint64_t free = m.budget > m.used ? m.budget - m.used : 0;
    if (best < 0 || free > best_free) {
      best = i;
      best_free = free;
    }
  }
  if (best < 0) return AnyServing();
  return best;  // its budget answers whether the tensor fits
}

absl::StatusOr<std::vector<TensorShard>> Engine::ShardRows(const TensorMeta& meta,
                                                            absl::string_view what) const {
  if (meta.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": only a [rows, cols] tensor can be "
                                                   "sharded by rows, got ", meta.DebugString()));
  }
  std::vector<int> serving;
  for (int i = 0; i < num_devices(); ++i) {
    if (Serving(i).ok()) serving.push_back(i);
  }
  if (serving.empty()) return AnyServing();
  const int64_t rows = meta.shape[0];
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(rows, static_cast<int64_t>(serving.size())));
  std::vector<TensorShard> shards;
  int64_t begin = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows / n + (i < rows % n ? 1 : 0);
    shards.push_back({.device = serving[i], .row_begin = begin, .rows = r});
    begin += r;
  }
  return shards;
}

absl::StatusOr<BufferPtr> Engine::AllocateCopy(const StoredTensor& t, int dst) {
  absl::StatusOr<BufferPtr> buffer = backend(dst).Allocate(t.meta.Bytes());
  if (buffer.ok()) return buffer;
  return absl::Status(buffer.status().code(),
                      absl::StrCat("tensor ", Quote(t.name), " (", t.meta.DebugString(), ", ",
                                   t.meta.Bytes(), " bytes) does not fit device ", device_name(dst),
                                   ": ", buffer.status().message()));
}

absl::StatusOr<StoredTensorPtr> Engine::CopyTo(const StoredTensor& t, int dst, uint64_t* bytes) {
  *bytes = 0;
  RETURN_IF_ERROR(Readable(t));
  auto copy = std::make_shared<StoredTensor>(StoredTensor{t.name, t.meta, nullptr, dst});
  if (!t.sharded() && t.device == dst) {
    copy->buffer = t.buffer;
    return copy;
  }
  absl::StatusOr<BufferPtr> buffer = AllocateCopy(t, dst);
  if (!buffer.ok()) return buffer.status();
  copy->buffer = *std::move(buffer);
  if (collectives_ == nullptr) return absl::InternalError("no copies between devices here");
  char* base = static_cast<char*>(copy->buffer->data());
  if (!t.sharded()) {
    RETURN_IF_ERROR(collectives_->Copy(dst, base, t.device, t.buffer->data(), t.meta.Bytes()));
    *bytes = t.meta.Bytes();
    return copy;
  }
  const uint64_t row_bytes = t.meta.shape[0] > 0 ? t.meta.Bytes() / t.meta.shape[0] : 0;
  for (const TensorShard& s : t.shards) {
    const uint64_t n = row_bytes * static_cast<uint64_t>(s.rows);
    RETURN_IF_ERROR(collectives_->Copy(dst, base + row_bytes * s.row_begin, s.device,
                                       s.buffer->data(), n));
    if (s.device != dst) *bytes += n;
  }
  return copy;
}

std::vector<uint64_t> Engine::ArrivalBlocks(const TensorMeta& meta, uint64_t* rows,
                                            uint64_t* row_bytes) {
  // On two H200s a GEMM spends 0.35 us per column of an 8192 x 8192 BF16 B, whose copy takes
  // 0.04: the first eighth's GEMM outlasts the copy of the rest.
  constexpr uint64_t kFirstBlockFraction = 8;
  const uint64_t bytes = meta.Bytes();
  *rows = meta.shape.size() == 2 && meta.shape[0] > 0 ? static_cast<uint64_t>(meta.shape[0]) : 1;
  *row_bytes = bytes / *rows;
  const uint64_t elem = ElementSize(meta.dtype);
  std::vector<uint64_t> ends;
  if (meta.shape.size() == 2 && elem > 0) {
    const uint64_t cols = *row_bytes / elem;
    const uint64_t first = elem * ((cols + kFirstBlockFraction - 1) / kFirstBlockFraction);
    if (first > 0 && first < *row_bytes) ends.push_back(first);
  }
  ends.push_back(*row_bytes);
  return ends;
}

absl::StatusOr<StoredTensorPtr> Engine::CopyInArriving(
    const StoredTensor& t, int dst, uint64_t* bytes, std::unique_ptr<ArrivingBroadcast>* running) {
  running->reset();
  if (t.sharded() || t.device == dst || collectives_ == nullptr || t.meta.Bytes() == 0) {
    return CopyTo(t, dst, bytes);
  }
  RETURN_IF_ERROR(Readable(t));
  absl::StatusOr<BufferPtr> buffer = AllocateCopy(t, dst);
  if (!buffer.ok()) return buffer.status();
  std::vector<void*> ptrs(num_devices(), nullptr);
  ptrs[t.device] = t.buffer->data();
  ptrs[dst] = (*buffer)->data();
  uint64_t rows = 0, row_bytes = 0;
  const std::vector<uint64_t> ends = ArrivalBlocks(t.meta, &rows, &row_bytes);
  absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> started =
      collectives_->StartBroadcast(t.device, ptrs, rows, row_bytes, ends);
  if (!started.ok()) {
    if (absl::IsUnimplemented(started.status())) return CopyTo(t, dst, bytes);
    return started.status();
  }
  auto copy = std::make_shared<StoredTensor>(StoredTensor{t.name, t.meta, *std::move(buffer), dst});
  copy->arrival = (*started)->arrival(dst);
  *running = *std::move(started);
  *bytes = t.meta.Bytes();
  return copy;
}

absl::Status Engine::CopyOut(const StoredTensor& t, uint64_t offset, void* dst, uint64_t bytes) {
  RETURN_IF_ERROR(Readable(t));
  auto one = [&](int d, const Buffer& b, uint64_t off, void* to, uint64_t n) {
    absl::Status s = backend(d).CopyOut(b, off, to, n);
    if (absl::Status h = backend(d).Healthy(); !h.ok()) MarkFailed(d, h);
    return s;
  };
  if (!t.sharded()) return one(t.device, *t.buffer, offset, dst, bytes);
  const uint64_t row_bytes = t.meta.shape[0] > 0 ? t.meta.Bytes() / t.meta.shape[0] : 0;
  char* out = static_cast<char*>(dst);
  for (const TensorShard& s : t.shards) {
    const uint64_t begin = row_bytes * s.row_begin, end = begin + row_bytes * s.rows;
    if (bytes == 0) break;
    if (offset >= end || offset < begin) continue;
    const uint64_t n = std::min(bytes, end - offset);
    RETURN_IF_ERROR(one(s.device, *s.buffer, offset - begin, out, n));
    out += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

int Engine::LeastLoaded() const {
  const int n = num_devices();
  const int start = static_cast<int>(round_robin_.fetch_add(1, std::memory_order_relaxed) % n);
  int best = -1, best_load = 0;
  for (int k = 0; k < n; ++k) {
    const int i = (start + k) % n;
    if (!Serving(i).ok()) continue;
    const int load = devices_[i]->load.load(std::memory_order_relaxed);
    if (best < 0 || load < best_load) {
      best = i;
      best_load = load;
    }
  }
  return best;
}

void Engine::BindStoredInputs(Graph& graph, const std::string& tenant) const {
  for (const GraphNode& node : graph.nodes) {
    for (const GraphInput& in : node.inputs) {
      if (in.source != GraphInput::Source::kStored) continue;
      if (std::any_of(graph.bound.begin(), graph.bound.end(),
                      [&](const StoredTensorPtr& t) { return t->name == in.name; })) {
        continue;
      }
      auto t = store_.Get(std::string(in.name), tenant);
      if (t.ok()) graph.bound.push_back(*std::move(t));  // a missing one: planning names it
    }
  }
}

absl::StatusOr<int> Engine::PlaceGraph(const Graph& graph) const {
  if (num_devices() == 1) return 0;
  if (graph.device >= 0) return graph.device;  // its CUDA shared memory is there
  std::map<int, uint64_t> bytes;  // per device
  for (const StoredTensorPtr& t : graph.bound) {
    RETURN_IF_ERROR(Readable(*t));
    if (!t->sharded()) {
      bytes[t->device] += t->meta.Bytes();
      continue;
    }
    for (const TensorShard& s : t->shards) bytes[s.device] += s.buffer ? s.buffer->bytes() : 0;
  }
  int best = -1;
  uint64_t most = 0;
  for (const auto& [d, b] : bytes) {
    if (!Serving(d).ok()) continue;
    const bool tie = best >= 0 && b == most;
    if (best < 0 || b > most ||
        (tie && devices_[d]->load.load(std::memory_order_relaxed) <
                    devices_[best]->load.load(std::memory_order_relaxed))) {
      best = d;
      most = b;
    }
  }
  if (best >= 0) return best;
  best = LeastLoaded();
  if (best < 0) return AnyServing();
  return best;
}

absl::Status Engine::GatherInputs(Request& request, int d) {
  std::map<const StoredTensor*, StoredTensorPtr> copies;
  for (PlanNode& n : request.plan_.nodes) {
    for (PlanInput& in : n.inputs) {
      if (in.source != PlanInput::Source::kStored) continue;
      const StoredTensor& t = *in.stored;
      if (!t.sharded() && t.device == d) continue;
      auto it = copies.find(&t);
      if (it == copies.end()) {
        const auto t0 = std::chrono::steady_clock::now();
        uint64_t bytes = 0;
        std::unique_ptr<ArrivingBroadcast> running;
        absl::StatusOr<StoredTensorPtr> copy = CopyInArriving(t, d, &bytes, &running);
        if (!copy.ok()) {
          return absl::Status(copy.status().code(),
                              absl::StrCat("node ", Quote(n.id), " (", n.op->name, ") reads ",
                                           t.sharded() ? "sharded " : "", "tensor ", Quote(t.name),
                                           ", which must be copied to ", device_name(d),
                                           " to run there: ", copy.status().message()));
        }
        request.peer_bytes_ += bytes;
        if (running) {  // timed, and its metrics recorded, when the request finishes
          request.arriving_.push_back({std::move(running), d, bytes});
        } else {
          request.peer_us_ += MicrosSince(t0);
          RecordPeerCopy(d, bytes, MicrosSince(t0) * 1e-6);
        }
        it = copies.emplace(&t, *std::move(copy)).first;
      }
      in.stored = it->second;
    }
  }
  return absl::OkStatus();
}

}  // namespace opserve
