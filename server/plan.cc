#include "server/plan.h"

#include <map>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/status_macros.h"

namespace opserve {
namespace {

// Ids come back in every NodeResult and error message: keep them short.
constexpr size_t kMaxNodeIdBytes = 256;


// Prefixes a status message with the node it is about, keeping the code.
absl::Status AtNode(const absl::Status& s, absl::string_view id, absl::string_view op) {
  return absl::Status(s.code(), absl::StrCat("node ", Quote(id), " (", op, "): ", s.message()));
}

absl::StatusOr<AttrMap> ConvertAttrs(const v1::Node& node, const OpSpec& op) {
  AttrMap attrs;
  for (const auto& [key, value] : node.attrs()) {
    bool known = false;
    for (absl::string_view a : op.attrs) known |= (a == key);
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown attribute ", Quote(key), "; ", op.name, " accepts ",
          op.attrs.empty() ? "none" : absl::StrJoin(op.attrs, ", ")));
    }
    switch (value.value_case()) {
      case v1::AttrValue::kI: attrs[key] = value.i(); break;
      case v1::AttrValue::kF: attrs[key] = value.f(); break;
      case v1::AttrValue::kS: attrs[key] = value.s(); break;
      case v1::AttrValue::kB: attrs[key] = value.b(); break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("attribute ", Quote(key), " has no value"));
    }
  }
  return attrs;
}

}  // namespace

uint64_t ResponseOverheadBytes(int num_nodes, size_t num_returned) {
  // Generous per-item bounds on the serialized framing: a NodeResult holds an id, op and
  // algorithm name (each at most a few hundred bytes in practice), a shape and 6 numbers.
  return 4096 + 1024 * static_cast<uint64_t>(num_nodes) + 512 * static_cast<uint64_t>(num_returned);
}

absl::StatusOr<TensorMeta> MetaFromProto(int dtype,
                                         const google::protobuf::RepeatedField<int64_t>& shape,
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

absl::StatusOr<Plan> BuildPlan(const v1::ExecuteRequest& request, const Backend& backend,
                               const TensorStore& store, const Limits& limits,
                               const std::string& ns) {
  const int num_nodes = request.nodes_size();
  if (num_nodes == 0) return absl::InvalidArgumentError("the graph has no nodes");
  if (num_nodes > limits.max_graph_nodes) {
    return absl::ResourceExhaustedError(absl::StrCat("the graph has ", num_nodes,
                                                     " nodes, over the limit of ",
                                                     limits.max_graph_nodes, " (--max_graph_nodes)"));
  }

  // Inline tensors: checked once here, whether or not a node reads them.
  Plan plan;
  plan.ns = ns;
  std::map<std::string, int, std::less<>> inline_index;
  for (const auto& [name, t] : request.inline_tensors()) {
    const std::string what = absl::StrCat("inline tensor ", Quote(name));
    RETURN_IF_ERROR(CheckTensorName(name, what));
    ASSIGN_OR_RETURN(TensorMeta meta, MetaFromProto(t.dtype(), t.shape(), limits.max_tensor_bytes, what));
    if (t.data().size() != meta.Bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": data has ", t.data().size(),
                                                     " bytes, expected ", meta.Bytes(), " for ",
                                                     meta.DebugString()));
    }
    inline_index[name] = static_cast<int>(plan.inlines.size());
    plan.inlines.push_back({name, std::move(meta), &t.data()});
  }

  // Node ids, then the edges between nodes.
  std::map<std::string, int, std::less<>> id_index;
  for (int i = 0; i < num_nodes; ++i) {
    const std::string& id = request.nodes(i).id();
    if (id.empty()) return absl::InvalidArgumentError(absl::StrCat("node ", i, " has an empty id"));
    if (id.size() > kMaxNodeIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("node ", i, " has an id of ", id.size(),
                                                     " bytes; ids need at most ", kMaxNodeIdBytes));
    }
    if (!id_index.emplace(id, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate node id ", Quote(id)));
    }
  }
  std::vector<std::vector<int>> consumers(num_nodes);
  std::vector<int> pending(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    const v1::Node& node = request.nodes(i);
    const OpSpec* op = FindOp(node.op());
    if (op == nullptr) {
      std::vector<absl::string_view> names;
      for (const OpSpec& o : Ops()) names.push_back(o.name);
      return absl::InvalidArgumentError(absl::StrCat("node ", Quote(node.id()), ": unknown op ",
                                                     Quote(node.op()), "; ops: ",
                                                     absl::StrJoin(names, ", ")));
    }
    if (node.inputs_size() != op->arity) {
      return absl::InvalidArgumentError(absl::StrCat("node ", Quote(node.id()), " (", op->name,
                                                     "): expected ", op->arity, " input(s), got ",
                                                     node.inputs_size()));
    }
    for (int j = 0; j < node.inputs_size(); ++j) {
      if (node.inputs(j).source_case() != v1::Input::kNode) continue;
      auto it = id_index.find(node.inputs(j).node());
      if (it == id_index.end()) {
        return absl::InvalidArgumentError(absl::StrCat("node ", Quote(node.id()), " input ", j,
                                                       ": refers to node ",
                                                       Quote(node.inputs(j).node()),
                                                       ", which is not in the graph"));
      }
      consumers[it->second].push_back(i);
      ++pending[i];
    }
  }

  // Kahn's algorithm: the order nodes run in; whatever is left over sits on a cycle.
  std::vector<int> order;
  std::queue<int> ready;
  for (int i = 0; i < num_nodes; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  while (!ready.empty()) {
    const int i = ready.front();
    ready.pop();
    order.push_back(i);
    for (int c : consumers[i]) {
      if (--pending[c] == 0) ready.push(c);
    }
  }
  if (static_cast<int>(order.size()) != num_nodes) {
    std::vector<std::string> cyclic;
    for (int i = 0; i < num_nodes; ++i) {
      if (pending[i] > 0) cyclic.push_back(Quote(request.nodes(i).id()));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the graph has a cycle through nodes ", absl::StrJoin(cyclic, ", ")));
  }

  // Nodes in order: resolve inputs, infer shapes, choose algorithms.
  std::vector<int> position(num_nodes);
  for (int p = 0; p < num_nodes; ++p) position[order[p]] = p;
  plan.nodes.resize(num_nodes);
  for (int p = 0; p < num_nodes; ++p) {
    const v1::Node& node = request.nodes(order[p]);
    PlanNode& n = plan.nodes[p];
    n.id = node.id();
    n.op = FindOp(node.op());
    auto at = [&](const absl::Status& s) { return AtNode(s, n.id, n.op->name); };
    auto attrs = ConvertAttrs(node, *n.op);
    if (!attrs.ok()) return at(attrs.status());
    n.attrs = *std::move(attrs);
    for (int j = 0; j < node.inputs_size(); ++j) {
      const v1::Input& in = node.inputs(j);
      PlanInput pi;
      switch (in.source_case()) {
        case v1::Input::kStored: {
          auto t = store.Get(in.stored(), ns);
          if (!t.ok()) return at(absl::Status(t.status().code(), absl::StrCat("input ", j, ": ", t.status().message())));
          pi.source = PlanInput::Source::kStored;
          pi.stored = *t;
          n.input_meta.push_back((*t)->meta);
          break;
        }
        case v1::Input::kInlineName: {
          auto it = inline_index.find(in.inline_name());
          if (it == inline_index.end()) {
            return at(absl::InvalidArgumentError(absl::StrCat(
                "input ", j, ": inline tensor ", Quote(in.inline_name()), " is not in the request")));
          }
          pi.source = PlanInput::Source::kInline;
          pi.index = it->second;
          n.input_meta.push_back(plan.inlines[it->second].meta);
          break;
        }
        case v1::Input::kNode: {
          const int src = position[id_index.find(in.node())->second];
          pi.source = PlanInput::Source::kNode;
          pi.index = src;
          plan.nodes[src].last_use = p;
          n.input_meta.push_back(plan.nodes[src].output);
          break;
        }
        default:
          return at(absl::InvalidArgumentError(
              absl::StrCat("input ", j, ": names no source (stored, inline_name or node)")));
      }
      n.inputs.push_back(std::move(pi));
    }
    auto out = n.op->infer(n.input_meta);
    if (!out.ok()) return at(out.status());
    n.output = *std::move(out);
    if (auto s = CheckMeta(n.output, limits.max_tensor_bytes, "output"); !s.ok()) return at(s);
    auto algo = ResolveAlgorithm(*n.op, n.input_meta, node.algorithm(), backend);
    if (!algo.ok()) return at(algo.status());
    n.algo = *algo;
    n.cost = n.op->cost(n.input_meta, n.output);
  }

  // Outputs: what leaves the request, inline or stored.
  uint64_t returned_bytes = 0;
  std::vector<std::string> returned_ids;
  std::map<std::string, bool, std::less<>> store_names;
  for (const v1::OutputSpec& o : request.outputs()) {
    auto it = id_index.find(o.node());
    if (it == id_index.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output refers to node ", Quote(o.node()), ", which is not in the graph"));
    }
    PlanNode& n = plan.nodes[position[it->second]];
    if (!o.return_inline() && o.store_as().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("output of node ", Quote(o.node()),
                                                     " neither returns inline nor stores"));
    }
    if (o.return_inline() && !n.returned) {
      n.returned = true;
      returned_bytes += n.output.Bytes();
      returned_ids.push_back(Quote(n.id));
    }
    if (!o.store_as().empty()) {
      RETURN_IF_ERROR(CheckTensorName(o.store_as(), absl::StrCat("output of node ", Quote(o.node()))));
      if (!store_names.emplace(o.store_as(), true).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("two outputs store under the name ", Quote(o.store_as())));
      }
      RETURN_IF_ERROR(store.CheckFree(o.store_as(), o.overwrite(), ns));
      n.store_as.push_back({o.store_as(), o.overwrite()});
    }
  }
  if (returned_bytes + ResponseOverheadBytes(num_nodes, returned_ids.size()) > limits.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the outputs of node(s) ", absl::StrJoin(returned_ids, ", "), " total ", returned_bytes,
        " bytes, which with the response's framing exceeds the limit of ", limits.max_message_bytes,
        " bytes (--max_message_bytes); store them and use GetTensor"));
  }
  return plan;
}

}  // namespace opserve
