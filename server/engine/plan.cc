#include "server/engine/plan.h"

#include <map>
#include <queue>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/fuse.h"

namespace opserve {
namespace {

// Ids come back in every NodeResult and error message: keep them short.
constexpr size_t kMaxNodeIdBytes = 256;


// Prefixes a status message with the node it is about, keeping the code.
absl::Status AtNode(const absl::Status& s, absl::string_view id, absl::string_view op) {
  return absl::Status(s.code(), absl::StrCat("node ", Quote(id), " (", op, "): ", s.message()));
}

// Every op takes this attribute: a bool, false keeping the node out of fusion (fuse.h). It is
// the planner's, so kernels never see it.
constexpr absl::string_view kFuseAttr = "fuse";

absl::StatusOr<AttrMap> CheckAttrs(const GraphNode& node, const OpSpec& op, bool* fuse) {
  AttrMap attrs;
  *fuse = true;
  for (const auto& [key, value] : node.attrs) {
    if (key == kFuseAttr) {
      const bool* b = value.has_value() ? std::get_if<bool>(&*value) : nullptr;
      if (b == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("attribute ", Quote(kFuseAttr), " takes a bool (b), to allow or stop fusion"));
      }
      *fuse = *b;
      continue;
    }
    bool known = false;
    for (absl::string_view a : op.attrs) known |= (a == key);
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown attribute ", Quote(key), "; ", op.name, " accepts ",
          op.attrs.empty() ? "" : absl::StrCat(absl::StrJoin(op.attrs, ", "), ", "), kFuseAttr));
    }
    if (!value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("attribute ", Quote(key), " has no value"));
    }
    attrs[std::string(key)] = *value;
  }
  return attrs;
}

}  // namespace

uint64_t ResponseOverheadBytes(int num_nodes, size_t num_returned) {
  // Generous per-item bounds on the serialized framing: a NodeResult holds an id, op and
  // algorithm name (each at most a few hundred bytes in practice), a shape and 6 numbers; with
  // the TensorInfo of an output it stores (a name of at most 256 bytes, a shape, the device) it
  // stays under 1024. The bound is checked here, before any device work, and only here.
  return 4096 + 1024 * static_cast<uint64_t>(num_nodes) + 512 * static_cast<uint64_t>(num_returned);
}

absl::StatusOr<TensorMeta> CheckedMeta(int dtype, std::span<const int64_t> shape,
                                       uint64_t max_bytes, absl::string_view what) {
  TensorMeta meta;
  // Kept as sent, known or not: CheckMeta refuses an unknown value by its number.
  meta.dtype = static_cast<DType>(dtype);
  if (shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank must be 0..", kMaxRank, ", got ", shape.size()));
  }
  meta.shape.assign(shape.begin(), shape.end());
  RETURN_IF_ERROR(CheckMeta(meta, max_bytes, what));
  return meta;
}

// See Plan::signature. Attribute values and names are length-prefixed, so no two different
// plans share a signature however their strings are chosen.
std::string PlanSignature(const Plan& plan) {
  std::string sig;
  auto add_string = [&](absl::string_view v) { absl::StrAppend(&sig, v.size(), ":", v); };
  for (const PlanNode& n : plan.nodes) {
    add_string(n.op->name);
    add_string(n.algo->name);
    absl::StrAppend(&sig, "f", n.fused_into, ";");
    for (const auto& [name, value] : n.attrs) {
      add_string(name);
      std::visit([&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          add_string(v);
        } else if constexpr (std::is_same_v<V, bool>) {
          sig += v ? "b1;" : "b0;";
        } else {
          absl::StrAppend(&sig, "v", v, ";");
        }
      }, value);
    }
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const PlanInput& in = n.inputs[j];
      absl::StrAppend(&sig, "<", static_cast<int>(in.source), ".",
                      in.source == PlanInput::Source::kNode ? in.index : -1, ".",
                      static_cast<int>(n.input_meta[j].dtype), ShapeString(n.input_meta[j].shape));
    }
    sig += "|";
  }
  return sig;
}

namespace {

// BuildPlan's stages, in the order it runs them. Each checks one part of the request and
// fills its part of the plan; the first error ends the planning.
class Planner {
 public:
  Planner(const Graph& graph, const Backend& backend, const TensorStore& store,
          const Limits& limits, const std::string& tenant)
      : graph_(graph), backend_(backend), store_(store), limits_(limits), tenant_(tenant),
        num_nodes_(static_cast<int>(graph.nodes.size())) {
    plan_.tenant = tenant;
  }

  absl::StatusOr<Plan> Build() {
    if (num_nodes_ == 0) return absl::InvalidArgumentError("the graph has no nodes");
    if (num_nodes_ > limits_.max_graph_nodes) {
      return absl::ResourceExhaustedError(absl::StrCat("the graph has ", num_nodes_,
                                                       " nodes, over the limit of ",
                                                       limits_.max_graph_nodes,
                                                       " (--max_graph_nodes)"));
    }
    RETURN_IF_ERROR(PlanInlines());
    RETURN_IF_ERROR(IndexNodeIds());
    RETURN_IF_ERROR(OrderNodes());
    plan_.nodes.resize(num_nodes_);
    for (int p = 0; p < num_nodes_; ++p) RETURN_IF_ERROR(PlanNodeAt(p));
    RETURN_IF_ERROR(PlanOutputs());
    FusePlan(plan_, backend_);
    plan_.signature = PlanSignature(plan_);
    return std::move(plan_);
  }

 private:
  // Inline tensors: checked once here, whether or not a node reads them.
  absl::Status PlanInlines() {
    for (const GraphInline& t : graph_.inlines) {
      const std::string name(t.name);
      const std::string what = absl::StrCat("inline tensor ", Quote(name));
      RETURN_IF_ERROR(CheckTensorName(name, what));
      ASSIGN_OR_RETURN(TensorMeta meta,
                       CheckedMeta(t.dtype, t.shape, limits_.max_tensor_bytes, what));
      const uint64_t has = t.device ? t.device->bytes() : t.data.size();
      if (!graph_.shapes_only && (t.device ? has < meta.Bytes() : has != meta.Bytes())) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": data has ", has,
                                                       " bytes, expected ", meta.Bytes(), " for ",
                                                       meta.DebugString()));
      }
      inline_index_[name] = static_cast<int>(plan_.inlines.size());
      plan_.inlines.push_back({name, std::move(meta), t.data, t.device});
    }
    return absl::OkStatus();
  }

  // Node ids: present, short and unique.
  absl::Status IndexNodeIds() {
    for (int i = 0; i < num_nodes_; ++i) {
      const absl::string_view id = graph_.nodes[i].id;
      if (id.empty()) return absl::InvalidArgumentError(absl::StrCat("node ", i, " has an empty id"));
      if (id.size() > kMaxNodeIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("node ", i, " has an id of ", id.size(),
                                                       " bytes; ids need at most ", kMaxNodeIdBytes));
      }
      if (!id_index_.emplace(id, i).second) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate node id ", Quote(id)));
      }
    }
    return absl::OkStatus();
  }

  // Each node's op and arity, the edges between nodes, then the order they run in (Kahn's
  // algorithm: whatever is left over sits on a cycle).
  absl::Status OrderNodes() {
    std::vector<std::vector<int>> consumers(num_nodes_);
    std::vector<int> pending(num_nodes_, 0);
    for (int i = 0; i < num_nodes_; ++i) {
      const GraphNode& node = graph_.nodes[i];
      const OpSpec* op = FindOp(node.op);
      if (op == nullptr) {
        std::vector<absl::string_view> names;
        for (const OpSpec& o : Ops()) names.push_back(o.name);
        return absl::InvalidArgumentError(absl::StrCat("node ", Quote(node.id), ": unknown op ",
                                                       Quote(node.op), "; ops: ",
                                                       absl::StrJoin(names, ", ")));
      }
      const int num_inputs = static_cast<int>(node.inputs.size());
      if (num_inputs != op->arity) {
        return absl::InvalidArgumentError(absl::StrCat("node ", Quote(node.id), " (", op->name,
                                                       "): expected ", op->arity,
                                                       " input(s), got ", num_inputs));
      }
      for (int j = 0; j < num_inputs; ++j) {
        if (node.inputs[j].source != GraphInput::Source::kNode) continue;
        auto it = id_index_.find(node.inputs[j].name);
        if (it == id_index_.end()) {
          return absl::InvalidArgumentError(absl::StrCat("node ", Quote(node.id), " input ", j,
                                                         ": refers to node ",
                                                         Quote(node.inputs[j].name),
                                                         ", which is not in the graph"));
        }
        consumers[it->second].push_back(i);
        ++pending[i];
      }
    }

    std::queue<int> ready;
    for (int i = 0; i < num_nodes_; ++i) {
      if (pending[i] == 0) ready.push(i);
    }
    while (!ready.empty()) {
      const int i = ready.front();
      ready.pop();
      order_.push_back(i);
      for (int c : consumers[i]) {
        if (--pending[c] == 0) ready.push(c);
      }
    }
    if (static_cast<int>(order_.size()) != num_nodes_) {
      std::vector<std::string> cyclic;
      for (int i = 0; i < num_nodes_; ++i) {
        if (pending[i] > 0) cyclic.push_back(Quote(graph_.nodes[i].id));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("the graph has a cycle through nodes ", absl::StrJoin(cyclic, ", ")));
    }
    position_.resize(num_nodes_);
    for (int p = 0; p < num_nodes_; ++p) position_[order_[p]] = p;
    return absl::OkStatus();
  }

  // The node that runs at position `p`: its attributes and inputs resolved, its output's shape
  // inferred, its algorithm chosen. The nodes before it are planned already.
  absl::Status PlanNodeAt(int p) {
    const GraphNode& node = graph_.nodes[order_[p]];
    PlanNode& n = plan_.nodes[p];
    n.id = std::string(node.id);
    n.op = FindOp(node.op);
    auto at = [&](const absl::Status& s) { return AtNode(s, n.id, n.op->name); };
    bool fuse = true;
    auto attrs = CheckAttrs(node, *n.op, &fuse);
    if (!attrs.ok()) return at(attrs.status());
    n.fusable = fuse && (node.algorithm.empty() || node.algorithm == "auto");
    n.attrs = *std::move(attrs);
    for (int j = 0; j < static_cast<int>(node.inputs.size()); ++j) {
      auto in = PlanInputOf(node.inputs[j], j, p, n);
      if (!in.ok()) return at(in.status());
      n.inputs.push_back(*std::move(in));
    }
    auto out = n.op->infer(n.input_meta);
    if (!out.ok()) return at(out.status());
    n.output = *std::move(out);
    if (auto s = CheckMeta(n.output, limits_.max_tensor_bytes, "output"); !s.ok()) return at(s);
    auto algo = ResolveAlgorithm(*n.op, n.input_meta, node.algorithm, backend_);
    if (!algo.ok()) return at(algo.status());
    n.algo = *algo;
    n.cost = n.op->cost(n.input_meta, n.output);
    return absl::OkStatus();
  }

  // A stored input: one the engine bound to the request, else the store's.
  absl::StatusOr<StoredTensorPtr> Lookup(absl::string_view name) const {
    for (const StoredTensorPtr& t : graph_.bound) {
      if (t->name == name) return t;
    }
    return store_.Get(std::string(name), tenant_);
  }

  // Input `j` of the node at position `p` (`n`), whose meta it appends to n.input_meta.
  absl::StatusOr<PlanInput> PlanInputOf(const GraphInput& in, int j, int p, PlanNode& n) {
    PlanInput pi;
    switch (in.source) {
      case GraphInput::Source::kStored: {
        auto t = Lookup(in.name);
        if (!t.ok()) {
          return absl::Status(t.status().code(),
                              absl::StrCat("input ", j, ": ", t.status().message()));
        }
        pi.source = PlanInput::Source::kStored;
        pi.stored = *t;
        n.input_meta.push_back((*t)->meta);
        break;
      }
      case GraphInput::Source::kInline: {
        auto it = inline_index_.find(in.name);
        if (it == inline_index_.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "input ", j, ": inline tensor ", Quote(in.name), " is not in the request"));
        }
        pi.source = PlanInput::Source::kInline;
        pi.index = it->second;
        n.input_meta.push_back(plan_.inlines[it->second].meta);
        break;
      }
      case GraphInput::Source::kNode: {
        const int src = position_[id_index_.find(in.name)->second];
        pi.source = PlanInput::Source::kNode;
        pi.index = src;
        plan_.nodes[src].last_use = p;
        n.input_meta.push_back(plan_.nodes[src].output);
        break;
      }
      case GraphInput::Source::kNone:
        return absl::InvalidArgumentError(
            absl::StrCat("input ", j, ": names no source (stored, inline_name or node)"));
    }
    return pi;
  }

  // Outputs: what leaves the request, inline, stored or into a shared-memory region; the
  // returned bytes within the message limit.
  absl::Status PlanOutputs() {
    uint64_t returned_bytes = 0;
    std::vector<std::string> returned_ids;
    std::map<std::string, bool, std::less<>> store_names;
    for (const GraphOutput& o : graph_.outputs) {
      auto it = id_index_.find(o.node);
      if (it == id_index_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("output refers to node ", Quote(o.node), ", which is not in the graph"));
      }
      PlanNode& n = plan_.nodes[position_[it->second]];
      if (!o.return_inline && o.store_as.empty() && !o.device_dest) {
        return absl::InvalidArgumentError(absl::StrCat("output of node ", Quote(o.node),
                                                       " neither returns inline nor stores"));
      }
      if (o.device_dest || o.host_dest != nullptr) {
        const uint64_t room = o.device_dest ? o.device_dest->bytes() : o.host_dest_bytes;
        if (room < n.output.Bytes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "output of node ", Quote(o.node), ": its destination holds ", room,
              " bytes, the output needs ", n.output.Bytes(), " for ", n.output.DebugString()));
        }
        if (n.device_dest || n.host_dest != nullptr || !o.store_as.empty() ||
            !n.store_as.empty() || (o.device_dest && o.return_inline)) {
          return OneDestinationError(o);
        }
        n.device_dest = o.device_dest;
        n.host_dest = o.host_dest;
      }
      if (o.return_inline && !n.returned) {
        n.returned = true;
        if (n.host_dest == nullptr) {
          returned_bytes += n.output.Bytes();
          returned_ids.push_back(Quote(n.id));
        }
      }
      if (!o.store_as.empty()) {
        const std::string name(o.store_as);
        RETURN_IF_ERROR(CheckTensorName(name, absl::StrCat("output of node ", Quote(o.node))));
        if (n.device_dest || n.host_dest != nullptr) return OneDestinationError(o);
        if (!store_names.emplace(name, true).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("two outputs store under the name ", Quote(name)));
        }
        RETURN_IF_ERROR(store_.CheckFree(name, o.overwrite, tenant_));
        n.store_as.push_back({name, o.overwrite, std::string(o.device)});
      }
    }
    if (returned_bytes + ResponseOverheadBytes(num_nodes_, returned_ids.size()) >
        limits_.max_message_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the outputs of node(s) ", absl::StrJoin(returned_ids, ", "), " total ", returned_bytes,
          " bytes, which with the response's framing exceeds the limit of ",
          limits_.max_message_bytes, " bytes (--max_message_bytes); store them and use GetTensor"));
    }
    return absl::OkStatus();
  }

  static absl::Status OneDestinationError(const GraphOutput& o) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output of node ", Quote(o.node),
        ": a shared-memory destination is its one destination (not stored, not returned twice)"));
  }

  const Graph& graph_;
  const Backend& backend_;
  const TensorStore& store_;
  const Limits& limits_;
  const std::string& tenant_;
  const int num_nodes_;
  Plan plan_;
  std::map<std::string, int, std::less<>> inline_index_;  // inline tensor name -> plan_.inlines
  std::map<absl::string_view, int> id_index_;              // node id -> index in graph_.nodes
  std::vector<int> order_;     // the graph's node indices in the order they run
  std::vector<int> position_;  // index in graph_.nodes -> position in plan_.nodes
};

}  // namespace

absl::StatusOr<Plan> BuildPlan(const Graph& graph, const Backend& backend,
                               const TensorStore& store, const Limits& limits,
                               const std::string& tenant) {
  return Planner(graph, backend, store, limits, tenant).Build();
}

}  // namespace opserve
