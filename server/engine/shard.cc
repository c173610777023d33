#include "server/engine/shard.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/engine.h"
#include "server/ops/op_util.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// How a node's output relates to the shards: computed whole in every part (kPlain), split by
// rows as the sharded tensor is (kRows), or one partial result per part to combine (kCombine).
enum class Kind { kPlain, kRows, kCombine };

bool RowOp(absl::string_view op) {
  return op == "row_sum" || op == "row_mean" || op == "row_max" || op == "row_min";
}
bool CombineOp(absl::string_view op) { return op == "sum" || op == "max" || op == "min"; }

// Each node's kind, or nullopt when the graph uses the sharded tensor `name` in a way that does
// not split by rows (then the engine gathers it instead).
std::optional<std::map<std::string, Kind>> Classify(const Graph& g, absl::string_view name) {
  std::map<std::string, Kind> kind;
  for (const GraphNode& n : g.nodes) kind[std::string(n.id)] = Kind::kPlain;
  auto input_kind = [&](const GraphInput& in) {
    if (in.source == GraphInput::Source::kStored && in.name == name) return Kind::kRows;
    if (in.source == GraphInput::Source::kNode) {
      auto it = kind.find(std::string(in.name));
      if (it != kind.end()) return it->second;
    }
    return Kind::kPlain;
  };
  // Kinds flow along the edges; as many rounds as nodes reach every node of an acyclic graph.
  for (size_t round = 0; round <= g.nodes.size(); ++round) {
    bool changed = false;
    for (const GraphNode& n : g.nodes) {
      std::vector<Kind> in;
      bool any = false;
      for (const GraphInput& i : n.inputs) {
        in.push_back(input_kind(i));
        any = any || in.back() != Kind::kPlain;
      }
      Kind k = Kind::kPlain;
      if (any) {
        if (RowOp(n.op) && in.size() == 1 && in[0] == Kind::kRows) {
          k = Kind::kRows;
        } else if (n.op == "matmul" && in.size() == 2 && in[0] == Kind::kRows && in[1] == Kind::kPlain) {
          k = Kind::kRows;
        } else if (CombineOp(n.op) && in.size() == 1 && in[0] == Kind::kRows) {
          k = Kind::kCombine;
        } else {
          return std::nullopt;
        }
      }
      Kind& cur = kind[std::string(n.id)];
      if (cur != k) {
        cur = k;
        changed = true;
      }
    }
    if (!changed) break;
  }
  return kind;
}

// The sharded tensor a graph reads (its stored inputs are bound: Engine::BindStoredInputs), when
// it reads exactly one (several would need their shards to line up; the engine gathers them
// instead).
StoredTensorPtr ShardedInput(const Graph& g) {
  StoredTensorPtr found;
  for (const StoredTensorPtr& t : g.bound) {
    if (!t->sharded()) continue;
    if (found) return nullptr;
    found = t;
  }
  return found;
}

template <typename T>
T Combine2(absl::string_view op, T a, T b) {
  if (op == "sum") return a + b;
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a || b != b) return a != a ? a : b;  // NaN wins, as in the kernels
    // -0 < +0, as the reference orders them (std::max keeps the first of equal zeros).
    if (a == b) return (std::signbit(a) == (op == "max")) ? b : a;
  }
  return op == "max" ? std::max(a, b) : std::min(a, b);
}

template <typename T>
void CombineAs(absl::string_view op, const std::vector<std::string>& parts, std::string* out) {
  T acc;
  std::memcpy(&acc, parts[0].data(), sizeof(T));
  for (size_t i = 1; i < parts.size(); ++i) {
    T v;
    std::memcpy(&v, parts[i].data(), sizeof(T));
    acc = Combine2(op, acc, v);
  }
  out->assign(reinterpret_cast<const char*>(&acc), sizeof(T));
}

// One scalar from the parts' partial results of `op` (sum, max, min).
absl::StatusOr<std::string> CombineParts(absl::string_view op, DType dtype,
                                         const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (p.size() != ElementSize(dtype)) {
      return absl::InternalError(absl::StrCat("a partial ", op, " has ", p.size(), " bytes"));
    }
  }
  switch (dtype) {
    case DType::kFloat32: CombineAs<float>(op, parts, &out); break;
    case DType::kInt64: CombineAs<int64_t>(op, parts, &out); break;
    case DType::kInt32: {
      // Wraps as the kernels do, with no signed overflow on the host.
      int32_t acc;
      std::memcpy(&acc, parts[0].data(), 4);
      for (size_t i = 1; i < parts.size(); ++i) {
        int32_t v;
        std::memcpy(&v, parts[i].data(), 4);
        acc = op == "sum" ? static_cast<int32_t>(static_cast<uint32_t>(acc) + static_cast<uint32_t>(v))
                          : Combine2(op, acc, v);
      }
      out.assign(reinterpret_cast<const char*>(&acc), 4);
      break;
    }
    case DType::kBFloat16: {
      float acc;
      uint16_t bits;
      std::memcpy(&bits, parts[0].data(), 2);
      acc = op_util::Bf16ToFloat(bits);
      for (size_t i = 1; i < parts.size(); ++i) {
        std::memcpy(&bits, parts[i].data(), 2);
        acc = Combine2(op, acc, op_util::Bf16ToFloat(bits));
      }
      bits = op_util::FloatToBf16(acc);
      out.assign(reinterpret_cast<const char*>(&bits), 2);
      break;
    }
    default: return absl::InternalError("no combine for this dtype");
  }
  return out;
}

}  // namespace

bool ShardedRun::Wanted(Engine& engine, const Request& request) {
  if (request.pinned_device_ >= 0) return false;
  const Graph& g = request.graph_;
  if (g.device >= 0) return false;  // bound to one GPU's shared memory
  for (const GraphOutput& o : g.outputs) {
    if (o.host_dest != nullptr || o.device_dest) return false;
  }
  StoredTensorPtr t = ShardedInput(g);
  if (!t || !engine.Readable(*t).ok()) return false;
  return Classify(g, t->name).has_value();
}

ShardedRun::ShardedRun(Engine& engine, std::unique_ptr<Request> request, StoredTensorPtr sharded)
    : engine_(engine), request_(std::move(request)), sharded_(std::move(sharded)) {}

void ShardedRun::Start(Engine& engine, std::unique_ptr<Request> request) {
  StoredTensorPtr t = ShardedInput(request->graph_);
  if (!t) return Request::Fail(std::move(request), absl::InternalError("the sharded input went"));
  auto* run = new ShardedRun(engine, std::move(request), t);
  const Graph& g = run->request_->graph_;
  // Each stored B of a matmul over the shards, copied to every shard's device in one broadcast.
  std::map<int, std::vector<StoredTensorPtr>> bound;  // per device: B's copies there
  std::map<absl::string_view, bool> seen;
  for (const GraphNode& n : g.nodes) {
    if (n.op != "matmul" || n.inputs.size() != 2) continue;
    const GraphInput& b = n.inputs[1];
    if (b.source != GraphInput::Source::kStored || b.name == t->name) continue;
    if (!seen.emplace(b.name, true).second) continue;
    auto stored = std::find_if(g.bound.begin(), g.bound.end(),
                               [&](const StoredTensorPtr& t) { return t->name == b.name; });
    if (stored == g.bound.end()) continue;  // not stored: the parts' planning names it
    const StoredTensor& src = **stored;
    absl::Status s = engine.Readable(src);
    std::vector<void*> ptrs(engine.num_devices(), nullptr);
    ptrs[src.device] = src.buffer->data();
    bool copies = false;
    std::vector<std::shared_ptr<StoredTensor>> fresh;  // this B's copies, to learn their arrival
    for (const TensorShard& sh : t->shards) {
      if (!s.ok()) break;
      if (sh.device == src.device) {
        bound[sh.device].push_back(*stored);
        continue;
      }
      auto buf = engine.backend(sh.device).Allocate(src.meta.Bytes());
      if (!buf.ok()) {
        s = absl::Status(buf.status().code(),
                         absl::StrCat("node ", Quote(n.id), " (matmul) broadcasts tensor ",
                                      Quote(src.name), " to ", engine.device_name(sh.device), ": ",
                                      buf.status().message()));
        break;
      }
      ptrs[sh.device] = (*buf)->data();
      auto copy = std::make_shared<StoredTensor>(StoredTensor{src.name, src.meta, *buf, sh.device});
      bound[sh.device].push_back(copy);
      run->broadcast_.push_back(copy);
      fresh.push_back(copy);
      copies = true;
    }
    if (s.ok() && copies && src.meta.Bytes() > 0) {
      s = run->Broadcast(engine, src, ptrs, fresh);
    }
    if (!s.ok()) {
      std::unique_ptr<Request> r = std::move(run->request_);
      delete run;
      return Request::Fail(std::move(r), s);
    }
  }
  run->pending_ = static_cast<int>(t->shards.size());
  run->parts_.resize(t->shards.size());
  std::vector<std::unique_ptr<Request>> parts;
  for (const TensorShard& sh : t->shards) {
    Graph part_graph = g;
    part_graph.bound = bound[sh.device];
    part_graph.bound.push_back(std::make_shared<StoredTensor>(
        StoredTensor{t->name, t->ShardMeta(sh), sh.buffer, sh.device}));
    // Then the request's own stored inputs: the first binding of a name wins (plan.cc).
    part_graph.bound.insert(part_graph.bound.end(), g.bound.begin(), g.bound.end());
    const Request& r = *run->request_;
    auto part = std::make_unique<Request>(r.rpc_, r.received_, nullptr, *run, r.tenant_,
                                          std::move(part_graph));
    part->pinned_device_ = sh.device;
    parts.push_back(std::move(part));
  }
  // The last part's Done may end the run: nothing touches `run` after the last Submit.
  for (std::unique_ptr<Request>& part : parts) engine.Submit(std::move(part));
}

absl::Status ShardedRun::Broadcast(Engine& engine, const StoredTensor& b,
                                   std::span<void* const> ptrs,
                                   const std::vector<std::shared_ptr<StoredTensor>>& copies) {
  const uint64_t bytes = b.meta.Bytes();
  broadcast_bytes_ += bytes * copies.size();
  // To one other device: a peer copy in blocks of columns the part's GEMM starts on
  // (KernelEnv::arriving), at the link's speed and hidden behind the GEMM (on two H200s: 0.38 ms
  // beside a 3 ms GEMM, where NCCL took 0.49 ms before it). To several: NCCL before the GEMMs,
  // its ring keeping every link busy, where peer copies from the root would share the root's.
  absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> started =
      absl::UnimplementedError("several receivers: NCCL's broadcast");
  if (copies.size() == 1) {
    uint64_t rows = 0, row_bytes = 0;
    const std::vector<uint64_t> ends = Engine::ArrivalBlocks(b.meta, &rows, &row_bytes);
    started = engine.collectives()->StartBroadcast(b.device, ptrs, rows, row_bytes, ends);
  }
  if (started.ok()) {
    for (const std::shared_ptr<StoredTensor>& c : copies)
      c->arrival = (*started)->arrival(c->device);
    arriving_.push_back({*std::move(started), copies});
    return absl::OkStatus();
  }
  if (!absl::IsUnimplemented(started.status())) return started.status();
  const Clock::time_point t0 = Clock::now();
  RETURN_IF_ERROR(engine.collectives()->Broadcast(b.device, ptrs, bytes));
  const double us = MicrosSince(t0);
  broadcast_us_ += us;
  for (const std::shared_ptr<StoredTensor>& c : copies)
    engine.RecordPeerCopy(c->device, bytes, us * 1e-6);
  return absl::OkStatus();
}

absl::Status ShardedRun::FinishBroadcasts() {
  absl::Status first;
  for (Arriving& a : arriving_) {
    double us = 0;
    absl::Status s = a.broadcast->Finish(&us);
    if (!s.ok() && first.ok()) first = s;
    arriving_us_ = std::max(arriving_us_, us);
    for (const auto& c : a.copies) engine_.RecordPeerCopy(c->device, c->meta.Bytes(), us * 1e-6);
  }
  arriving_.clear();
  return first;
}

absl::Status ShardedRun::CheckAlive() const { return request_->client_.CheckAlive(); }

void ShardedRun::Done(std::unique_ptr<Request> part) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < sharded_->shards.size(); ++i) {
      if (sharded_->shards[i].device == part->pinned_device_) {
        parts_[i] = std::move(part);
        break;
      }
    }
    if (--pending_ > 0) return;
  }
  absl::Status s;
  for (const auto& p : parts_) {
    if (!p->status().ok()) {
      s = p->status();
      break;
    }
  }
  // Every copy is done before B's copies go back, whether the parts read them or not.
  if (absl::Status b = FinishBroadcasts(); s.ok()) s = b;
  if (s.ok()) s = Combine();
  parts_.clear();
  broadcast_.clear();
  std::unique_ptr<Request> request = std::move(request_);
  request->status_ = s;
  RequestClient& client = request->client_;
  delete this;
  client.Done(std::move(request));
}

absl::Status ShardedRun::Combine() {
  const Graph& g = request_->graph_;
  std::map<std::string, Kind> kinds = *Classify(g, sharded_->name);
  ExecuteResult& r0 = parts_[0]->result_;
  ExecuteResult out;
  out.nodes = r0.nodes;
  for (size_t j = 0; j < out.nodes.size(); ++j) {
    NodeReport& n = out.nodes[j];
    const Kind k = kinds[n.id];
    if (k == Kind::kPlain) continue;
    n.cost = Cost{};
    int64_t rows = 0;
    for (const auto& p : parts_) {
      const NodeReport& pn = p->result_.nodes[j];
      n.kernel_seconds = std::max(n.kernel_seconds, pn.kernel_seconds);
      n.cost.bytes += pn.cost.bytes;
      n.cost.flops += pn.cost.flops;
      if (k == Kind::kRows) rows += pn.output.shape[0];
    }
    if (k == Kind::kRows) n.output.shape[0] = rows;
  }
  for (size_t j = 0; j < r0.outputs.size(); ++j) {
    ReturnedTensor o = r0.outputs[j];
    const Kind k = kinds[o.node];
    if (k == Kind::kRows) {
      o.data.clear();
      o.meta.shape[0] = 0;
      for (const auto& p : parts_) {
        const ReturnedTensor& po = p->result_.outputs[j];
        o.data += po.data;
        o.meta.shape[0] += po.meta.shape[0];
      }
    } else if (k == Kind::kCombine) {
      std::vector<std::string> partial;
      for (const auto& p : parts_) partial.push_back(p->result_.outputs[j].data);
      absl::string_view op;
      for (const GraphNode& gn : g.nodes) {
        if (gn.id == o.node) op = gn.op;
      }
      ASSIGN_OR_RETURN(o.data, CombineParts(op, o.meta.dtype, partial));
    }
    out.outputs.push_back(std::move(o));
  }
  // Stored outputs: each part left its own uncommitted (Plan::commit), in the same order.
  std::vector<StoredTensorPtr> to_store;
  std::vector<bool> overwrite;
  for (size_t k = 0; k < r0.stored.size(); ++k) {
    const StoredTensorPtr& first = r0.stored[k];
    const GraphOutput* spec = nullptr;
    for (const GraphOutput& o : g.outputs) {
      if (o.store_as == first->name) spec = &o;
    }
    if (spec == nullptr) return absl::InternalError("a stored output without its spec");
    const Kind kind = kinds[std::string(spec->node)];
    StoredTensorPtr whole = first;
    if (kind == Kind::kRows) {
      auto t = std::make_shared<StoredTensor>(StoredTensor{first->name, first->meta, nullptr, -1});
      t->meta.shape[0] = 0;
      for (const auto& p : parts_) {
        const StoredTensorPtr& ps = p->result_.stored[k];
        t->shards.push_back({.device = ps->device, .row_begin = t->meta.shape[0],
                             .rows = ps->meta.shape[0], .buffer = ps->buffer});
        t->meta.shape[0] += ps->meta.shape[0];
      }
      whole = t;
    } else if (kind == Kind::kCombine) {
      std::vector<std::string> partial;
      for (const auto& p : parts_) {
        const StoredTensorPtr& ps = p->result_.stored[k];
        std::string bytes(ps->meta.Bytes(), '\0');
        RETURN_IF_ERROR(engine_.backend(ps->device).CopyOut(*ps->buffer, 0, bytes.data(), bytes.size()));
        partial.push_back(std::move(bytes));
      }
      absl::string_view op;
      for (const GraphNode& gn : g.nodes) {
        if (gn.id == spec->node) op = gn.op;
      }
      ASSIGN_OR_RETURN(std::string combined, CombineParts(op, first->meta.dtype, partial));
      ASSIGN_OR_RETURN(BufferPtr buf, engine_.backend(first->device).Allocate(combined.size()));
      RETURN_IF_ERROR(engine_.backend(first->device).CopyIn(*buf, combined.data(), combined.size()));
      whole = std::make_shared<StoredTensor>(StoredTensor{first->name, first->meta, buf, first->device});
    }
    if (!spec->device.empty()) {
      ASSIGN_OR_RETURN(int dst, engine_.FindDevice(spec->device, absl::StrCat("store_as ", Quote(first->name))));
      if (whole->sharded() || whole->device != dst) {
        const Clock::time_point t0 = Clock::now();
        uint64_t bytes = 0;
        ASSIGN_OR_RETURN(whole, engine_.CopyTo(*whole, dst, &bytes));
        out.peer_copy_bytes += bytes;
        out.peer_copy_us += MicrosSince(t0);
      }
    }
    to_store.push_back(std::move(whole));
    overwrite.push_back(spec->overwrite);
  }
  if (!to_store.empty()) {
    RETURN_IF_ERROR(engine_.store().InsertAll(to_store, overwrite, request_->tenant_,
                                              [this] { return CheckAlive(); }));
  }
  out.stored = std::move(to_store);
  double peer_us = 0;
  for (const auto& p : parts_) {
    const ExecuteResult& pr = p->result_;
    out.input_us = std::max(out.input_us, pr.input_us);
    out.compute_us = std::max(out.compute_us, pr.compute_us);
    out.output_us = std::max(out.output_us, pr.output_us);
    out.peer_copy_bytes += pr.peer_copy_bytes;
    peer_us = std::max(peer_us, pr.peer_copy_us);
    absl::StrAppend(&out.device, out.device.empty() ? "" : ",", pr.device);
    request_->queue_us_ = std::max(request_->queue_us_, p->queue_us());
  }
  out.peer_copy_bytes += broadcast_bytes_;
  // A broadcast that ran beside the GEMMs counts as copy time, not as time before the compute.
  out.peer_copy_us += peer_us + broadcast_us_ + arriving_us_;
  out.input_us += broadcast_us_;
  out.replay = r0.replay;
  request_->result_ = std::move(out);
  return absl::OkStatus();
}

}  // namespace opserve
