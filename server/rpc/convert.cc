#include "server/rpc/convert.h"

#include <algorithm>
#include <optional>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/lifted_parse.h"

namespace opserve::convert {
namespace {

// Dtypes cross the boundary by a cast.
static_assert(static_cast<int>(DType::kFloat32) == v1::FLOAT32 &&
                  static_cast<int>(DType::kInt32) == v1::INT32 &&
                  static_cast<int>(DType::kInt64) == v1::INT64 &&
                  static_cast<int>(DType::kBFloat16) == v1::BFLOAT16,
              "common/dtype.h's values must be opserve.v1.DType's");

GraphInput InputFromProto(const v1::Input& in) {
  switch (in.source_case()) {
    case v1::Input::kStored: return {GraphInput::Source::kStored, in.stored()};
    case v1::Input::kInlineName: return {GraphInput::Source::kInline, in.inline_name()};
    case v1::Input::kNode: return {GraphInput::Source::kNode, in.node()};
    default: return {GraphInput::Source::kNone, {}};
  }
}

std::optional<AttrValue> AttrFromProto(const v1::AttrValue& value) {
  switch (value.value_case()) {
    case v1::AttrValue::kI: return value.i();
    case v1::AttrValue::kF: return value.f();
    case v1::AttrValue::kS: return value.s();
    case v1::AttrValue::kB: return value.b();
    default: return std::nullopt;
  }
}

template <typename Message>
void ShapeToProto(const TensorMeta& meta, Message* m) {
  m->set_dtype(static_cast<v1::DType>(meta.dtype));
  for (int64_t d : meta.shape) m->add_shape(d);
}

}  // namespace

Graph GraphFromProto(const v1::ExecuteRequest& request) {
  Graph g;
  g.nodes.reserve(request.nodes_size());
  for (const v1::Node& node : request.nodes()) {
    GraphNode& n = g.nodes.emplace_back();
    n.id = node.id();
    n.op = node.op();
    n.algorithm = node.algorithm();
    for (const auto& [key, value] : node.attrs()) n.attrs.emplace_back(key, AttrFromProto(value));
    for (const v1::Input& in : node.inputs()) n.inputs.push_back(InputFromProto(in));
  }
  for (const auto& [name, t] : request.inline_tensors()) {
    g.inlines.push_back({name, t.dtype(), std::span<const int64_t>(t.shape().data(),
                                                                   t.shape().size()),
                         t.data()});
  }
  for (const v1::OutputSpec& o : request.outputs()) {
    g.outputs.push_back({o.node(), o.return_inline(), o.store_as(), o.overwrite()});
    g.outputs.back().device = o.device();
  }
  return g;
}

absl::StatusOr<Graph> GraphFromExecute(const v1::ExecuteRequest& req, const ParsedLifts& lifts,
                                       SharedMemoryRegistry& regions, const std::string& tenant,
                                       std::vector<RegionRange>* holds) {
  Graph g = GraphFromProto(req);
  for (GraphInline& t : g.inlines) {
    const v1::Tensor& proto = req.inline_tensors().at(std::string(t.name));
    const std::optional<absl::string_view> lifted = LiftedByKey(lifts.lifted, t.name);
    if (lifted) t.data = *lifted;
    if (!proto.has_shm()) continue;
    const std::string what = absl::StrCat("inline tensor ", Quote(t.name));
    if (!proto.data().empty() || lifted) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": give its bytes in data or in a shared memory region, not both"));
    }
    const v1::SharedMemoryRef& shm = proto.shm();
    auto r = ResolveRegion(regions, tenant, shm.region(), shm.offset(), shm.byte_size());
    if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat(what, ": ", r.status().message()));
    if (r->host != nullptr) {
      t.data = absl::string_view(r->host, shm.byte_size());
    } else {
      t.device = r->device;  // the plan checks the size against the shape either way
      g.device = r->device_index;
    }
    holds->push_back(*std::move(r));
  }
  return g;
}

void ResultToProto(ExecuteResult result, v1::ExecuteResponse* response,
                   std::span<const std::string> devices) {
  for (const NodeReport& n : result.nodes) {
    const double s = n.kernel_seconds;
    v1::NodeResult* r = response->add_nodes();
    r->set_id(n.id);
    r->set_op(std::string(n.op));
    r->set_algorithm(std::string(n.algorithm));
    ShapeToProto(n.output, r);
    r->set_kernel_us(s * 1e6);
    r->set_bytes(n.cost.bytes);
    r->set_flops(n.cost.flops);
    r->set_gbps(s > 0 ? n.cost.bytes / s / 1e9 : 0);
    r->set_gflops(s > 0 ? n.cost.flops / s / 1e9 : 0);
    r->set_fused_into(n.fused_into);
  }
  for (ReturnedTensor& out : result.outputs) {
    v1::NamedTensor* nt = response->add_outputs();
    nt->set_node(std::move(out.node));
    ShapeToProto(out.meta, nt->mutable_tensor());
    nt->mutable_tensor()->set_data(std::move(out.data));
  }
  for (const StoredTensorPtr& t : result.stored) {
    if (devices.empty()) {
      const std::string here[] = {result.device};
      TensorInfoToProto(*t, here, response->add_stored());
    } else {
      TensorInfoToProto(*t, devices, response->add_stored());
    }
  }
  v1::RequestTiming* timing = response->mutable_timing();
  timing->set_input_us(result.input_us);
  timing->set_compute_us(result.compute_us);
  timing->set_output_us(result.output_us);
  timing->set_peer_copy_us(result.peer_copy_us);
  response->set_peer_copy_bytes(result.peer_copy_bytes);
  response->set_device(std::move(result.device));
  response->set_batch_size(static_cast<uint32_t>(result.batch_size));
  switch (result.replay) {
    case GraphReplay::kNotUsed: response->set_graph(v1::GRAPH_NOT_USED); break;
    case GraphReplay::kCaptured: response->set_graph(v1::GRAPH_CAPTURED); break;
    case GraphReplay::kReplayed: response->set_graph(v1::GRAPH_REPLAYED); break;
    case GraphReplay::kRebound: response->set_graph(v1::GRAPH_REBOUND); break;
  }
}

void TensorInfoToProto(const StoredTensor& tensor, std::span<const std::string> devices,
                       v1::TensorInfo* info) {
  auto name = [&](int d) {
    return d >= 0 && d < static_cast<int>(devices.size()) ? devices[d] : std::string("?");
  };
  info->set_name(tensor.name);
  ShapeToProto(tensor.meta, info);
  info->set_bytes(tensor.meta.Bytes());
  if (!tensor.sharded()) {
    info->set_device(name(devices.size() == 1 ? 0 : tensor.device));
    return;
  }
  std::string all;
  const uint64_t row_bytes = tensor.meta.shape[0] > 0 ? tensor.meta.Bytes() / tensor.meta.shape[0] : 0;
  for (const TensorShard& s : tensor.shards) {
    absl::StrAppend(&all, all.empty() ? "" : ",", name(s.device));
    v1::TensorShard* ps = info->add_shards();
    ps->set_device(name(s.device));
    ps->set_row_begin(s.row_begin);
    ps->set_rows(s.rows);
    ps->set_bytes(row_bytes * static_cast<uint64_t>(s.rows));
  }
  info->set_device(all);
}

void OpsToProto(const Engine& engine, v1::ListOpsResponse* response) {
  const Backend& backend = engine.backend(0);
  response->set_backend(backend.name());
  response->set_device(backend.description());
  for (int i = 0; i < engine.num_devices(); ++i) {
    const Backend& b = engine.backend(i);
    const MemoryStats m = b.Memory();
    const absl::Status serving = engine.Serving(i);
    v1::DeviceInfo* d = response->add_devices();
    d->set_name(engine.device_name(i));
    d->set_description(b.description());
    d->set_capability(b.name() == "cuda" ? absl::StrCat("sm_", b.compute_capability()) : b.name());
    d->set_memory_total(m.total);
    d->set_memory_budget(m.budget);
    d->set_memory_used(m.used);
    d->set_serving(serving.ok());
    d->set_error(std::string(serving.message()));
    for (const OpSpec& op : Ops()) {
      for (const AlgoSpec* a : AlgorithmsFor(op.name, b)) {
        d->add_algorithms(absl::StrCat(op.name, "/", a->name));
      }
    }
  }
  for (const OpSpec& op : Ops()) {
    // The union over the devices, in the table's order: a mixed node offers what any device runs.
    std::vector<const AlgoSpec*> algos;
    for (const AlgoSpec* a : AlgorithmsFor(op.name, backend)) algos.push_back(a);
    for (int i = 1; i < engine.num_devices(); ++i) {
      for (const AlgoSpec* a : AlgorithmsFor(op.name, engine.backend(i))) {
        if (std::find(algos.begin(), algos.end(), a) == algos.end()) algos.push_back(a);
      }
    }
    if (algos.empty()) continue;
    v1::OpInfo* info = response->add_ops();
    info->set_name(std::string(op.name));
    info->set_description(std::string(op.description));
    // Exactly what this backend runs: the union of its algorithms' dtypes.
    for (DType d : DTypesFor(op.name, backend)) info->add_dtypes(static_cast<v1::DType>(d));
    for (const AlgoSpec* a : algos) {
      v1::AlgorithmInfo* ai = info->add_algorithms();
      ai->set_name(std::string(a->name));
      for (DType d : a->dtypes) ai->add_dtypes(static_cast<v1::DType>(d));
      ai->set_deterministic(a->deterministic);
      ai->set_is_default(a->is_default);
      ai->set_description(std::string(a->description));
      if (a->is_default) info->set_default_algorithm(std::string(a->name));
    }
  }
}

}  // namespace opserve::convert
