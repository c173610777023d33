#include "server/rpc/oip_unserved_params.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/ops/tensor.h"

namespace opserve::oip {
namespace {

using inference::InferParameter;
using Params = google::protobuf::Map<std::string, InferParameter>;

// Whether `key`, if present, asks for something: sequence_id an integer or a string, the
// sequence flags booleans, classification an integer. A value of another type is refused.
absl::StatusOr<bool> Asks(const Params& params, const std::string& key, absl::string_view where) {
  auto it = params.find(key);
  if (it == params.end()) return false;
  const InferParameter& p = it->second;
  const bool flag = key == "sequence_start" || key == "sequence_end";
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      if (flag) return p.bool_param();
      break;
    case InferParameter::kInt64Param:
      if (!flag) return p.int64_param() != 0;
      break;
    case InferParameter::kUint64Param:
      if (!flag) return p.uint64_param() != 0;
      break;
    case InferParameter::kStringParam:
      if (key == "sequence_id") return !p.string_param().empty();
      break;
    default: break;
  }
  const absl::string_view want = flag                  ? "a boolean"
                                 : key == "sequence_id" ? "an integer or a string"
                                                        : "an integer";
  return absl::InvalidArgumentError(absl::StrCat(where, ": parameter '", key, "' must be ", want));
}

}  // namespace

absl::Status CheckUnservedParameters(const inference::ModelInferRequest& req) {
  const std::string model = Quote(req.model_name());
  for (const char* key : {"sequence_id", "sequence_start", "sequence_end"}) {
    absl::StatusOr<bool> asks = Asks(req.parameters(), key, "request");
    if (!asks.ok()) return asks.status();
    if (*asks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model, " is not a sequence model: parameter '", key,
          "' is for sequence models only (opserve has none)"));
    }
  }
  for (const auto& o : req.outputs()) {
    const std::string what = absl::StrCat("output ", Quote(o.name()));
    absl::StatusOr<bool> asks = Asks(o.parameters(), "classification", what);
    if (!asks.ok()) return asks.status();
    if (*asks) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of model ", model, ": parameter 'classification' (the top classes as BYTES "
          "strings) is not served; request the output without it and rank its values"));
    }
  }
  return absl::OkStatus();
}

}  // namespace opserve::oip
