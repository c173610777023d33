#include "server/http/infer_body.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "server/http/infer_json.h"
#include "server/http/json_proto.h"

namespace opserve::http {
namespace {

using inference::ModelInferRequest;

// The parameters of the binary extension, which the HTTP layer answers and the service never
// sees.
constexpr char kBinaryDataSize[] = "binary_data_size";
constexpr char kBinaryData[] = "binary_data";
constexpr char kBinaryDataOutput[] = "binary_data_output";
// Binary data is read in blocks of this size: under glibc's 32 MiB mmap threshold
// (server/rpc/host_malloc.h), so their memory stays mapped for the next request.
constexpr uint64_t kBlockBytes = 8 << 20;

// The request's "parameters" with `key` taken out as a boolean (false when absent).
absl::StatusOr<bool> TakeBool(Params* params, const std::string& key, absl::string_view where) {
  auto it = params->find(key);
  if (it == params->end()) return false;
  if (it->second.parameter_choice_case() != inference::InferParameter::kBoolParam) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": parameter '", key, "' must be true or false"));
  }
  const bool v = it->second.bool_param();
  params->erase(it);
  return v;
}

absl::StatusOr<std::string> StringMember(const rapidjson::Value& o, const char* key,
                                         absl::string_view where, bool required) {
  auto it = o.FindMember(key);
  if (it == o.MemberEnd()) {
    if (!required) return std::string();
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' is missing"));
  }
  if (!it->value.IsString()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", key, "' must be a string"));
  }
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

class RequestReader {
 public:
  RequestReader(uint64_t binary_bytes, const ReadBinary& read, InferHttpRequest* out)
      : left_(binary_bytes), read_(read), out_(*out), req_(out->message) {}

  absl::Status Read(std::string_view header);

 private:
  absl::Status Input(int i, const rapidjson::Value& in);
  absl::Status Output(int i, const rapidjson::Value& o);

  uint64_t left_;  // bytes of the binary part not yet handed to an input
  std::vector<std::optional<DataWriter>> taken_;  // the inputs' "data" the parse took
  const ReadBinary& read_;
  InferHttpRequest& out_;
  ModelInferRequest& req_;
};

absl::Status RequestReader::Read(std::string_view header) {
  rapidjson::Document doc;
  RETURN_IF_ERROR(ParseInferJson(header, &doc, &taken_));
  ASSIGN_OR_RETURN(*req_.mutable_id(), StringMember(doc, "id", "infer request", false));
  if (auto p = doc.FindMember("parameters"); p != doc.MemberEnd()) {
    RETURN_IF_ERROR(ReadParameters(p->value, "infer request", req_.mutable_parameters()));
    ASSIGN_OR_RETURN(out_.binary_by_default,
                     TakeBool(req_.mutable_parameters(), kBinaryDataOutput, "infer request"));
  }
  auto inputs = doc.FindMember("inputs");
  if (inputs == doc.MemberEnd() || !inputs->value.IsArray()) {
    return absl::InvalidArgumentError("infer request: 'inputs' must be an array of tensors");
  }
  int i = 0;
  for (const auto& in : inputs->value.GetArray()) RETURN_IF_ERROR(Input(i++, in));
  if (auto outputs = doc.FindMember("outputs"); outputs != doc.MemberEnd()) {
    if (!outputs->value.IsArray()) {
      return absl::InvalidArgumentError("infer request: 'outputs' must be an array");
    }
    i = 0;
    for (const auto& o : outputs->value.GetArray()) RETURN_IF_ERROR(Output(i++, o));
  }
  if (left_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("infer request: ", left_,
                     " bytes of binary data follow the JSON header that no input's "
                     "binary_data_size claims"));
  }
  return absl::OkStatus();
}

absl::Status RequestReader::Input(int i, const rapidjson::Value& in) {
  std::string what = absl::StrCat("inputs[", i, "]");
  if (!in.IsObject()) return absl::InvalidArgumentError(absl::StrCat(what, " must be an object"));
  auto* t = req_.add_inputs();
  ASSIGN_OR_RETURN(*t->mutable_name(), StringMember(in, "name", what, true));
  what = absl::StrCat("input '", t->name(), "'");
  ASSIGN_OR_RETURN(*t->mutable_datatype(), StringMember(in, "datatype", what, true));
  auto shape = in.FindMember("shape");
  if (shape == in.MemberEnd() || !shape->value.IsArray()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": 'shape' must be an array of integers"));
  }
  for (const auto& d : shape->value.GetArray()) {
    if (!d.IsInt64()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": 'shape' must be an array of integers"));
    }
    t->add_shape(d.GetInt64());
  }
  std::optional<uint64_t> binary_size;
  if (auto p = in.FindMember("parameters"); p != in.MemberEnd()) {
    RETURN_IF_ERROR(ReadParameters(p->value, what, t->mutable_parameters()));
    if (auto b = t->parameters().find(kBinaryDataSize); b != t->parameters().end()) {
      const inference::InferParameter& v = b->second;
      if (v.has_int64_param() && v.int64_param() >= 0) {
        binary_size = static_cast<uint64_t>(v.int64_param());
      } else if (v.has_uint64_param()) {
        binary_size = v.uint64_param();
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": parameter 'binary_data_size' must be a non-negative integer"));
      }
      t->mutable_parameters()->erase(kBinaryDataSize);
    }
  }
  const auto data = in.FindMember("data");
  const bool elsewhere = t->parameters().count("shared_memory_region") ||
                         t->parameters().count("opserve_stored_tensor");
  if (binary_size.has_value()) {
    if (data != in.MemberEnd()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": both 'data' and binary_data_size; give its bytes one way"));
    }
    if (*binary_size > left_) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": binary_data_size is ", *binary_size, " but only ", left_,
                       " bytes of binary data are left after the JSON header"));
    }
    left_ -= *binary_size;
    RawInput& raw = out_.raw.emplace_back();
    raw.bytes = *binary_size;
    for (uint64_t at = 0; at < *binary_size; at += kBlockBytes) {
      const uint64_t n = std::min(kBlockBytes, *binary_size - at);
      // Not zeroed: every byte is read into.
      char* block = out_.blocks.emplace_back(new char[n]).get();
      RETURN_IF_ERROR(read_(block, n));
      raw.pieces.emplace_back(block, n);
    }
    return absl::OkStatus();
  }
  if (data != in.MemberEnd()) {
    // A datatype opserve does not run goes on without bytes: the service names it.
    const std::optional<DType> dtype = DTypeFromOipName(t->datatype());
    if (!dtype.has_value()) return absl::OkStatus();
    std::string& bytes = out_.encoded.emplace_back();
    if (static_cast<size_t>(i) < taken_.size() && taken_[i].has_value()) {
      RETURN_IF_ERROR(taken_[i]->Finish(what, &bytes));
    } else {
      RETURN_IF_ERROR(EncodeData(data->value, *dtype, what, &bytes));
    }
    out_.raw.push_back({{bytes}, bytes.size()});
    return absl::OkStatus();
  }
  if (!elsewhere) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        " carries no bytes: give it 'data', the binary_data_size parameter (binary tensor "
        "data), a shared_memory_region or an opserve_stored_tensor"));
  }
  return absl::OkStatus();
}

absl::Status RequestReader::Output(int i, const rapidjson::Value& o) {
  std::string what = absl::StrCat("outputs[", i, "]");
  if (!o.IsObject()) return absl::InvalidArgumentError(absl::StrCat(what, " must be an object"));
  auto* t = req_.add_outputs();
  ASSIGN_OR_RETURN(*t->mutable_name(), StringMember(o, "name", what, true));
  what = absl::StrCat("output '", t->name(), "'");
  bool binary = out_.binary_by_default;
  if (auto p = o.FindMember("parameters"); p != o.MemberEnd()) {
    RETURN_IF_ERROR(ReadParameters(p->value, what, t->mutable_parameters()));
    if (t->parameters().count(kBinaryData)) {
      ASSIGN_OR_RETURN(binary, TakeBool(t->mutable_parameters(), kBinaryData, what));
    }
  }
  out_.binary[t->name()] = binary;
  return absl::OkStatus();
}

// `raw` (the output's bytes as `datatype`'s elements) as a flat JSON array.
absl::Status WriteData(const std::string& raw, const std::string& datatype, const std::string& name,
                       JsonWriter& w) {
  const std::optional<DType> dtype = DTypeFromOipName(datatype);
  if (!dtype.has_value() || raw.size() % ElementSize(*dtype) != 0) {
    return absl::InternalError(
        absl::StrCat("output '", name, "' of datatype ", datatype, " has ", raw.size(), " bytes"));
  }
  const char* p = raw.data();
  const size_t n = raw.size() / ElementSize(*dtype);
  w.StartArray();
  for (size_t i = 0; i < n; ++i) {
    switch (*dtype) {
      case DType::kFloat32: {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        w.Double(v);
        break;
      }
      case DType::kBFloat16: {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        w.Double(FromBFloat16(v));
        break;
      }
      case DType::kInt32: {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        w.Int(v);
        break;
      }
      case DType::kInt64: {
        int64_t v;
        std::memcpy(&v, p + 8 * i, 8);
        w.Int64(v);
        break;
      }
      case DType::kInvalid:
        break;
    }
  }
  w.EndArray();
  return absl::OkStatus();
}

}  // namespace

absl::Status InferRequestFromHttp(std::string_view header, uint64_t binary_bytes,
                                  const ReadBinary& read, InferHttpRequest* out) {
  return RequestReader(binary_bytes, read, out).Read(header);
}

absl::Status InferResponseToHttp(const inference::ModelInferResponse& response,
                                 const InferHttpRequest& request, std::string* json,
                                 std::vector<std::string_view>* binary) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  w.StartObject();
  w.Key("model_name");
  w.String(response.model_name().c_str());
  w.Key("model_version");
  w.String(response.model_version().c_str());
  if (!response.id().empty()) {
    w.Key("id");
    w.String(response.id().data(), static_cast<rapidjson::SizeType>(response.id().size()));
  }
  w.Key("parameters");
  WriteParameters(response.parameters(), w);
  w.Key("outputs");
  w.StartArray();
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& o = response.outputs(i);
    static const std::string kNone;
    const std::string& raw =
        i < response.raw_output_contents_size() ? response.raw_output_contents(i) : kNone;
    // An output that went to a region or the store has no bytes here: its parameters say where.
    const bool in_message =
        !o.parameters().count("shared_memory_region") && !o.parameters().count("opserve_stored_as");
    auto b = request.binary.find(o.name());
    const bool as_binary =
        in_message && (b != request.binary.end() ? b->second : request.binary_by_default);
    w.StartObject();
    w.Key("name");
    w.String(o.name().c_str());
    w.Key("datatype");
    w.String(o.datatype().c_str());
    w.Key("shape");
    w.StartArray();
    for (int64_t d : o.shape()) w.Int64(d);
    w.EndArray();
    Params params = o.parameters();
    if (as_binary) params[kBinaryDataSize].set_int64_param(static_cast<int64_t>(raw.size()));
    w.Key("parameters");
    WriteParameters(params, w);
    if (as_binary) {
      binary->push_back(raw);
    } else if (in_message) {
      w.Key("data");
      RETURN_IF_ERROR(WriteData(raw, o.datatype(), o.name(), w));
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  json->assign(buffer.GetString(), buffer.GetSize());
  return absl::OkStatus();
}

}  // namespace opserve::http
