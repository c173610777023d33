#include "server/rpc/model_info.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "server/rpc/oip_convert.h"

namespace opserve::oip {
namespace {

void GraphTensorMetadata(const v1::GraphTensor& t,
                         inference::ModelMetadataResponse::TensorMetadata* m) {
  m->set_name(t.name());
  m->set_datatype(std::string(OipName(static_cast<DType>(t.dtype()))));
  *m->mutable_shape() = t.shape();
}

// The protocol's datatype name as model_config.proto's enum, whose names are the protocol's
// with "TYPE_" in front (BYTES aside, which opserve has not): read from the generated enum
// rather than kept as another table.
inference::DataType ConfigDataType(const std::string& datatype) {
  inference::DataType t = inference::TYPE_INVALID;
  if (!inference::DataType_Parse(absl::StrCat("TYPE_", datatype), &t)) {
    return inference::TYPE_INVALID;
  }
  return t;
}

}  // namespace

void OpMetadata(const OpSpec& op, const DeviceProperties& device,
                inference::ModelMetadataResponse* resp) {
  resp->set_platform("opserve_op");
  const std::vector<DType> dtypes = DTypesFor(op.name, device);
  const DType dtype = dtypes.empty() ? DType::kFloat32 : dtypes.front();
  // The typical case of the highest rank (sum takes any rank; [] would read as a scalar).
  const std::vector<std::vector<int64_t>>* best = &op.test.small_shapes.front();
  for (const auto& c : op.test.small_shapes) {
    if (c.front().size() > best->front().size()) best = &c;
  }
  const std::vector<std::vector<int64_t>>& shapes = *best;
  const std::span<const absl::string_view> names = OpInputNames(op);
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < names.size(); ++i) {
    auto* in = resp->add_inputs();
    in->set_name(std::string(names[i]));
    in->set_datatype(std::string(OipName(dtype)));
    for (size_t d = 0; d < shapes[i].size(); ++d) in->add_shape(-1);
    metas.push_back(TensorMeta{dtype, shapes[i]});
  }
  auto* out = resp->add_outputs();
  out->set_name(std::string(kOpOutputName));
  if (auto meta = op.infer(metas); meta.ok()) {
    out->set_datatype(std::string(OipName(meta->dtype)));
    for (size_t d = 0; d < meta->shape.size(); ++d) out->add_shape(-1);
  }
}

void GraphMetadata(const SavedGraph& graph, inference::ModelMetadataResponse* resp) {
  resp->set_platform("opserve_graph");
  for (const auto& t : graph.info.inputs()) GraphTensorMetadata(t, resp->add_inputs());
  for (const auto& t : graph.info.outputs()) GraphTensorMetadata(t, resp->add_outputs());
}

void ConfigFromMetadata(const inference::ModelMetadataResponse& meta, int server_max_batch_size,
                        inference::ModelConfig* config) {
  config->set_name(meta.name());
  // As ModelMetadata's: Triton answers ModelMetadata with its configuration's platform.
  config->set_platform(meta.platform());
  config->set_backend("opserve");
  // Triton's max_batch_size N > 0 says that the model takes an extra first dimension of up to N
  // that `dims` leave out, and its clients (perf_analyzer, tritonclient's helpers) then send
  // [batch, dims...]. opserve's batching (server/engine/batch.h, --max_batch_size) adds no
  // dimension: it runs whole requests of one plan as one, each with its own shapes. So every
  // model answers 0 (dims are the whole shape, which the request gives in full), and how many
  // requests may share a run is its own parameter.
  config->set_max_batch_size(0);
  (*config->mutable_parameters())["opserve_max_batch_size"].set_string_value(
      absl::StrCat(server_max_batch_size));
  for (const auto& t : meta.inputs()) {
    inference::ModelInput* in = config->add_input();
    in->set_name(t.name());
    in->set_data_type(ConfigDataType(t.datatype()));
    *in->mutable_dims() = t.shape();
  }
  for (const auto& t : meta.outputs()) {
    inference::ModelOutput* out = config->add_output();
    out->set_name(t.name());
    out->set_data_type(ConfigDataType(t.datatype()));
    *out->mutable_dims() = t.shape();
  }
}

}  // namespace opserve::oip
