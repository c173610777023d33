#include "server/rpc/oip_convert.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/lifted_parse.h"
#include "server/rpc/oip_unserved_params.h"

namespace opserve::oip {
namespace {

using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using Params = google::protobuf::Map<std::string, InferParameter>;

const InferParameter* FindParam(const Params& params, const std::string& key) {
  auto it = params.find(key);
  return it == params.end() ? nullptr : &it->second;
}

absl::StatusOr<std::string> StringParam(const Params& params, const std::string& key,
                                        absl::string_view where) {
  const InferParameter* p = FindParam(params, key);
  if (p == nullptr) return std::string();
  if (p->parameter_choice_case() != InferParameter::kStringParam) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": parameter '", key, "' must be a string"));
  }
  return p->string_param();
}

absl::StatusOr<uint64_t> SizeParam(const Params& params, const std::string& key,
                                   absl::string_view where, bool required) {
  const InferParameter* p = FindParam(params, key);
  if (p == nullptr) {
    if (!required) return 0;
    return absl::InvalidArgumentError(absl::StrCat(where, ": parameter '", key, "' is missing"));
  }
  switch (p->parameter_choice_case()) {
    case InferParameter::kUint64Param: return p->uint64_param();
    case InferParameter::kInt64Param:
      if (p->int64_param() >= 0) return static_cast<uint64_t>(p->int64_param());
      break;
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": parameter '", key, "' must be a non-negative integer"));
}

std::string ShapeText(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

void SetDouble(Params* params, const std::string& key, double v) {
  (*params)[key].set_double_param(v);
}

// GraphFromInfer's steps: the model, then each input, then the outputs.
class GraphBuilder {
 public:
  GraphBuilder(const ParsedRequest<ModelInferRequest>& parsed, const std::string& tenant,
               ServerCore& core, InferBinding& binding)
      : parsed_(parsed), req_(parsed.message), tenant_(tenant), core_(core), binding_(binding) {}

  absl::StatusOr<Graph> Build();

 private:
  // A model input: its name, and for a saved graph the dtype and shape it declares.
  struct ModelInput {
    std::string name;
    int dtype = 0;                   // 0: any the op takes
    std::span<const int64_t> shape;  // empty with dtype 0: any
    const OpSpec* op = nullptr;      // an op model's op: the datatypes it takes
  };

  absl::Status AddInput(int i, const ModelInput& model_input, int* raw_used, Graph* graph);
  absl::Status AddOutputs(const std::vector<std::pair<std::string, std::string>>& model_outputs,
                          Graph* graph);

  const ParsedRequest<ModelInferRequest>& parsed_;  // raw_input_contents are read through it
  const ModelInferRequest& req_;
  const std::string& tenant_;
  ServerCore& core_;
  InferBinding& binding_;
};

absl::StatusOr<Graph> GraphBuilder::Build() {
  const std::string& model = req_.model_name();
  RETURN_IF_ERROR(CheckModelVersion(model, req_.model_version()));
  ASSIGN_OR_RETURN(const std::string algorithm, StringParam(req_.parameters(), "algorithm", "request"));
  Graph g;
  std::vector<ModelInput> inputs;
  std::vector<std::pair<std::string, std::string>> model_outputs;  // (output name, node)
  if (const OpSpec* op = FindOp(model); op != nullptr) {
    GraphNode& n = g.nodes.emplace_back();
    n.id = op->name;
    n.op = op->name;
    n.algorithm = binding_.owned.emplace_back(algorithm);
    for (absl::string_view name : OpInputNames(*op)) {
      inputs.push_back({std::string(name), 0, {}, op});
      n.inputs.push_back({GraphInput::Source::kInline, name});
    }
    model_outputs.emplace_back(std::string(kOpOutputName), std::string(op->name));
  } else {
    auto saved = core_.graphs().Find(tenant_, model);
    if (!saved.ok()) {
      return absl::NotFoundError(absl::StrCat("no model ", Quote(model),
                                              " (models: the ops, and the saved graphs of ListGraphs)"));
    }
    if (!algorithm.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the 'algorithm' parameter picks an op model's algorithm; the nodes of saved graph ",
          Quote(model), " name their own"));
    }
    binding_.saved = *saved;
    g = convert::GraphFromProto(binding_.saved->request);
    g.inlines.clear();
    g.outputs.clear();
    for (const auto& [name, t] : binding_.saved->request.inline_tensors()) {
      inputs.push_back({name, t.dtype(), std::span<const int64_t>(t.shape().data(), t.shape().size())});
    }
    // The template's stored outputs stay; its returned ones are the model's outputs.
    for (const v1::OutputSpec& o : binding_.saved->request.outputs()) {
      if (!o.store_as().empty()) {
        g.outputs.push_back({o.node(), false, o.store_as(), o.overwrite()});
        g.outputs.back().device = o.device();
      }
      if (o.return_inline()) model_outputs.emplace_back(o.node(), o.node());
    }
  }

  RETURN_IF_ERROR(CheckUnservedParameters(req_));
  // Inputs: each of the model's exactly once, nothing else.
  std::set<std::string> seen;
  for (const auto& in : req_.inputs()) {
    bool known = false;
    for (const ModelInput& m : inputs) known |= m.name == in.name();
    if (!known) {
      std::vector<std::string> names;
      for (const ModelInput& m : inputs) names.push_back(Quote(m.name));
      return absl::InvalidArgumentError(absl::StrCat("model ", Quote(model), " has no input ",
                                                     Quote(in.name()), " (its inputs: ",
                                                     absl::StrJoin(names, ", "), ")"));
    }
    if (!seen.insert(in.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("input ", Quote(in.name()), " appears twice"));
    }
  }
  for (const ModelInput& m : inputs) {
    if (!seen.count(m.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", Quote(model), " needs input ", Quote(m.name), ", which is missing"));
    }
  }
  int raw_used = 0;
  for (int i = 0; i < req_.inputs_size(); ++i) {
    for (const ModelInput& m : inputs) {
      if (m.name == req_.inputs(i).name()) RETURN_IF_ERROR(AddInput(i, m, &raw_used, &g));
    }
  }
  // An op's inputs share one datatype: said here in the protocol's words, before the op's own
  // check says it in opserve's.
  for (int i = 1; i < req_.inputs_size() && !inputs.empty() && inputs[0].op != nullptr; ++i) {
    if (req_.inputs(i).datatype() != req_.inputs(0).datatype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", Quote(req_.inputs(i).name()), " is ", req_.inputs(i).datatype(), " and input ",
          Quote(req_.inputs(0).name()), " ", req_.inputs(0).datatype(), ": ", model,
          "'s inputs share one datatype"));
    }
  }
  if (raw_used != req_.raw_input_contents_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", req_.raw_input_contents_size(), " entries, but ", raw_used,
        " input(s) take their bytes from it (one entry per such input, in the order of inputs)"));
  }
  RETURN_IF_ERROR(AddOutputs(model_outputs, &g));
  return g;
}

absl::Status GraphBuilder::AddInput(int i, const ModelInput& model_input, int* raw_used,
                                    Graph* graph) {
  const ModelInferRequest::InferInputTensor& in = req_.inputs(i);
  const std::string what = absl::StrCat("input ", Quote(in.name()));
  std::optional<DType> dtype = DTypeFromOipName(in.datatype());
  if (!dtype) {
    std::vector<absl::string_view> names;
    for (DType d : kAllDTypes) names.push_back(OipName(d));
    return absl::InvalidArgumentError(absl::StrCat(what, ": datatype ", Quote(in.datatype()),
                                                   " is not one opserve runs (",
                                                   absl::StrJoin(names, ", "), ")"));
  }
  if (const OpSpec* op = model_input.op;
      op != nullptr && std::find(op->dtypes.begin(), op->dtypes.end(), *dtype) == op->dtypes.end()) {
    std::vector<std::string> names;
    for (DType d : op->dtypes) names.emplace_back(OipName(d));
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", op->name, " takes ",
                                                   absl::StrJoin(names, ", "), ", not ", in.datatype()));
  }
  const std::span<const int64_t> shape(in.shape().data(), in.shape().size());
  if (model_input.dtype != 0) {  // a saved graph's input: its declared dtype and shape
    bool fits = model_input.dtype == static_cast<int>(*dtype) &&
                model_input.shape.size() == shape.size();
    for (size_t d = 0; fits && d < shape.size(); ++d) {
      fits = model_input.shape[d] == -1 || model_input.shape[d] == shape[d];
    }
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is ", in.datatype(), " ", ShapeText(shape), "; the model takes ",
          OipName(static_cast<DType>(model_input.dtype)), " ", ShapeText(model_input.shape),
          " (-1: any size)"));
    }
  }
  ASSIGN_OR_RETURN(TensorMeta meta, CheckedMeta(static_cast<int>(*dtype), shape,
                                                core_.options().limits.max_tensor_bytes, what));
  GraphInline t{in.name(), static_cast<int>(*dtype), shape};
  ASSIGN_OR_RETURN(const std::string stored, StringParam(in.parameters(), "opserve_stored_tensor", what));
  ASSIGN_OR_RETURN(const std::string region, StringParam(in.parameters(), "shared_memory_region", what));
  const bool has_contents = in.has_contents();
  if (!stored.empty() + !region.empty() + has_contents > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": give its bytes one way: a stored tensor, a shared memory region or contents"));
  }
  if (!stored.empty()) {
    ASSIGN_OR_RETURN(StoredTensorPtr s, core_.store().Get(stored, tenant_));
    if (!(s->meta == meta)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": stored tensor ", Quote(stored), " is ",
                                                     s->meta.DebugString(), ", the request says ",
                                                     meta.DebugString()));
    }
    // The nodes read the stored tensor where they would have read the input.
    const absl::string_view name = binding_.owned.emplace_back(stored);
    for (GraphNode& n : graph->nodes) {
      for (GraphInput& gi : n.inputs) {
        if (gi.source == GraphInput::Source::kInline && gi.name == in.name()) {
          gi = {GraphInput::Source::kStored, name};
        }
      }
    }
    return absl::OkStatus();
  }
  if (!region.empty()) {
    ASSIGN_OR_RETURN(const uint64_t offset,
                     SizeParam(in.parameters(), "shared_memory_offset", what, false));
    ASSIGN_OR_RETURN(const uint64_t bytes,
                     SizeParam(in.parameters(), "shared_memory_byte_size", what, true));
    if (bytes != meta.Bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shared_memory_byte_size is ", bytes,
                                                     ", the tensor ", meta.DebugString(), " has ",
                                                     meta.Bytes(), " bytes"));
    }
    ASSIGN_OR_RETURN(RegionRange r, ResolveRegion(core_.regions(), tenant_, region, offset, bytes));
    if (r.host != nullptr) {
      t.data = absl::string_view(r.host, bytes);
    } else {
      t.device = r.device;
      graph->device = r.device_index;
    }
    binding_.holds.push_back(std::move(r));
  } else if (has_contents) {
    if (req_.raw_input_contents_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has contents while the request has raw_input_contents: use one or the other"));
    }
    const auto& c = in.contents();
    std::string& bytes = binding_.owned.emplace_back();
    size_t count = 0;
    switch (*dtype) {
      case DType::kFloat32:
        count = c.fp32_contents_size();
        bytes.assign(reinterpret_cast<const char*>(c.fp32_contents().data()), count * 4);
        break;
      case DType::kInt32:
        count = c.int_contents_size();
        bytes.assign(reinterpret_cast<const char*>(c.int_contents().data()), count * 4);
        break;
      case DType::kInt64:
        count = c.int64_contents_size();
        bytes.assign(reinterpret_cast<const char*>(c.int64_contents().data()), count * 8);
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", in.datatype(), " has no typed contents field; send raw_input_contents"));
    }
    if (count != static_cast<size_t>(meta.NumElements())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": contents hold ", count, " ",
                                                     in.datatype(), " values; shape ",
                                                     ShapeText(shape), " has ", meta.NumElements()));
    }
    t.data = bytes;
  } else {
    if (*raw_used >= req_.raw_input_contents_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " carries no bytes: give it raw_input_contents, contents, a shared memory region "
          "or an opserve_stored_tensor"));
    }
    t.data = LiftedAt(parsed_.lifted, *raw_used, req_.raw_input_contents(*raw_used));
    ++*raw_used;
  }
  graph->inlines.push_back(t);
  return absl::OkStatus();
}

absl::Status GraphBuilder::AddOutputs(
    const std::vector<std::pair<std::string, std::string>>& model_outputs, Graph* graph) {
  std::set<std::string> seen;
  for (const auto& o : req_.outputs()) {
    const std::string what = absl::StrCat("output ", Quote(o.name()));
    const std::pair<std::string, std::string>* model_output = nullptr;
    for (const auto& m : model_outputs) {
      if (m.first == o.name()) model_output = &m;
    }
    if (model_output == nullptr) {
      std::vector<std::string> names;
      for (const auto& m : model_outputs) names.push_back(Quote(m.first));
      return absl::InvalidArgumentError(absl::StrCat("model ", Quote(req_.model_name()),
                                                     " has no output ", Quote(o.name()),
                                                     " (its outputs: ", absl::StrJoin(names, ", "), ")"));
    }
    if (!seen.insert(o.name()).second) return absl::InvalidArgumentError(absl::StrCat(what, " is requested twice"));
    InferOutput out{o.name(), model_output->second};
    ASSIGN_OR_RETURN(out.region, StringParam(o.parameters(), "shared_memory_region", what));
    ASSIGN_OR_RETURN(out.store_as, StringParam(o.parameters(), "opserve_store_as", what));
    GraphOutput go{binding_.owned.emplace_back(out.node)};
    if (!out.region.empty() && !out.store_as.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": a shared memory region or opserve_store_as, not both"));
    }
    if (!out.region.empty()) {
      out.to = InferOutput::To::kRegion;
      ASSIGN_OR_RETURN(out.offset, SizeParam(o.parameters(), "shared_memory_offset", what, false));
      ASSIGN_OR_RETURN(out.byte_size, SizeParam(o.parameters(), "shared_memory_byte_size", what, true));
      ASSIGN_OR_RETURN(RegionRange r,
                       ResolveRegion(core_.regions(), tenant_, out.region, out.offset, out.byte_size));
      if (r.host != nullptr) {
        go.return_inline = true;
        go.host_dest = r.host;
        go.host_dest_bytes = out.byte_size;
      } else {
        go.device_dest = r.device;
        graph->device = r.device_index;
      }
      binding_.holds.push_back(std::move(r));
    } else if (!out.store_as.empty()) {
      out.to = InferOutput::To::kStore;
      go.store_as = binding_.owned.emplace_back(out.store_as);
      const InferParameter* ow = FindParam(o.parameters(), "opserve_overwrite");
      go.overwrite = ow != nullptr && ow->parameter_choice_case() == InferParameter::kBoolParam &&
                     ow->bool_param();
    } else {
      go.return_inline = true;
    }
    graph->outputs.push_back(go);
    binding_.outputs.push_back(std::move(out));
  }
  if (req_.outputs_size() == 0) {  // none requested: every output, in the message
    for (const auto& [name, node] : model_outputs) {
      graph->outputs.push_back({binding_.owned.emplace_back(node), true});
      binding_.outputs.push_back({name, node});
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::span<const absl::string_view> OpInputNames(const OpSpec& op) {
  static constexpr absl::string_view kUnary[] = {"x"};
  static constexpr absl::string_view kBinary[] = {"a", "b"};
  if (op.arity == 1) return kUnary;
  return kBinary;
}

absl::Status CheckModelVersion(absl::string_view model, absl::string_view version) {
  if (version.empty() || version == "1") return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model ", Quote(model), " has no version ",
                                          Quote(version), "; its one version is '1'"));
}

absl::StatusOr<Graph> GraphFromInfer(const ParsedRequest<ModelInferRequest>& parsed,
                                     const std::string& tenant, ServerCore& core,
                                     InferBinding* binding) {
  return GraphBuilder(parsed, tenant, core, *binding).Build();
}

void ResultToInfer(ExecuteResult result, double queue_us, const ModelInferRequest& req,
                   const InferBinding& binding, ModelInferResponse* resp) {
  resp->set_model_name(req.model_name());
  resp->set_model_version("1");
  resp->set_id(req.id());
  Params* params = resp->mutable_parameters();
  double kernel_us = 0;
  for (const NodeReport& n : result.nodes) {
    const double us = n.kernel_seconds * 1e6;
    const double gbps = n.kernel_seconds > 0 ? n.cost.bytes / n.kernel_seconds / 1e9 : 0;
    if (n.fused_into.empty()) kernel_us += us;  // a fused kernel counts once
    if (binding.saved == nullptr) {  // an op model: its one node
      (*params)["algorithm"].set_string_param(std::string(n.algorithm));
      SetDouble(params, "gbps", gbps);
    } else {
      (*params)[absl::StrCat(n.id, ".algorithm")].set_string_param(std::string(n.algorithm));
      SetDouble(params, absl::StrCat(n.id, ".kernel_us"), us);
      if (!n.fused_into.empty()) {
        (*params)[absl::StrCat(n.id, ".fused_into")].set_string_param(n.fused_into);
      }
      SetDouble(params, absl::StrCat(n.id, ".gbps"), gbps);
    }
  }
  SetDouble(params, "kernel_us", kernel_us);
  SetDouble(params, "compute_us", result.compute_us);
  SetDouble(params, "queue_us", queue_us);
  (*params)["batch_size"].set_int64_param(result.batch_size);
  for (const InferOutput& o : binding.outputs) {
    auto* out = resp->add_outputs();
    out->set_name(o.name);
    for (const NodeReport& n : result.nodes) {
      if (n.id != o.node) continue;
      out->set_datatype(std::string(OipName(n.output.dtype)));
      for (int64_t d : n.output.shape) out->add_shape(d);
    }
    std::string* raw = resp->add_raw_output_contents();
    switch (o.to) {
      case InferOutput::To::kMessage:
        for (ReturnedTensor& r : result.outputs) {
          if (r.node == o.node && !r.in_place) {
            *raw = std::move(r.data);
            break;
          }
        }
        break;
      case InferOutput::To::kRegion:
        (*out->mutable_parameters())["shared_memory_region"].set_string_param(o.region);
        (*out->mutable_parameters())["shared_memory_offset"].set_uint64_param(o.offset);
        (*out->mutable_parameters())["shared_memory_byte_size"].set_uint64_param(o.byte_size);
        break;
      case InferOutput::To::kStore:
        (*out->mutable_parameters())["opserve_stored_as"].set_string_param(o.store_as);
        break;
    }
  }
}


void SetTotalUs(double us, ModelInferResponse* response) {
  SetDouble(response->mutable_parameters(), "total_us", us);
}

}  // namespace opserve::oip
