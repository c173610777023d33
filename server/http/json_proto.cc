#include "server/http/json_proto.h"

#include <google/protobuf/descriptor.h>
#include <rapidjson/error/en.h>

#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace opserve::http {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void WriteString(const std::string& s, JsonWriter& w) {
  w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
}

void WriteKey(const std::string& s, JsonWriter& w) {
  w.Key(s.data(), static_cast<rapidjson::SizeType>(s.size()));
}

// One value of field `f` (element `i` of a repeated field, or the singular value when i < 0).
void WriteValue(const Message& m, const FieldDescriptor* f, int i, JsonWriter& w) {
  const Reflection* r = m.GetReflection();
  const bool rep = i >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      w.Int(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      w.Int64(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      w.Uint(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      w.Uint64(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      w.Double(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      w.Double(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      w.Bool(rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      WriteString((rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f))->name(), w);
      break;
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& s = rep ? r->GetRepeatedStringReference(m, f, i, &scratch)
                                 : r->GetStringReference(m, f, &scratch);
      if (f->type() == FieldDescriptor::TYPE_BYTES) {
        w.StartObject();
        w.Key("b64");
        WriteString(absl::Base64Escape(s), w);
        w.EndObject();
      } else {
        WriteString(s, w);
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      WriteMessage(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f), w);
      break;
  }
}

// A map entry's key as JSON object keys are: text.
std::string MapKey(const Message& entry) {
  const FieldDescriptor* k = entry.GetDescriptor()->map_key();
  const Reflection* r = entry.GetReflection();
  switch (k->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(entry, k);
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(entry, k));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(entry, k));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(entry, k));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(entry, k));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, k) ? "true" : "false";
    default:
      return "";
  }
}

void WriteParameter(const inference::InferParameter& p, JsonWriter& w) {
  using P = inference::InferParameter;
  switch (p.parameter_choice_case()) {
    case P::kBoolParam:
      w.Bool(p.bool_param());
      break;
    case P::kInt64Param:
      w.Int64(p.int64_param());
      break;
    case P::kStringParam:
      WriteString(p.string_param(), w);
      break;
    case P::kDoubleParam:
      w.Double(p.double_param());
      break;
    case P::kUint64Param:
      w.Uint64(p.uint64_param());
      break;
    default:
      w.Null();
      break;
  }
}

}  // namespace

void WriteMessage(const Message& m, JsonWriter& w) {
  if (const auto* p = dynamic_cast<const inference::InferParameter*>(&m); p != nullptr) {
    return WriteParameter(*p, w);
  }
  const Reflection* r = m.GetReflection();
  const auto* d = m.GetDescriptor();
  w.StartObject();
  for (int n = 0; n < d->field_count(); ++n) {
    const FieldDescriptor* f = d->field(n);
    if (f->is_map()) {
      WriteKey(f->name(), w);
      w.StartObject();
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        const Message& entry = r->GetRepeatedMessage(m, f, i);
        WriteKey(MapKey(entry), w);
        WriteValue(entry, entry.GetDescriptor()->map_value(), -1, w);
      }
      w.EndObject();
    } else if (f->is_repeated()) {
      WriteKey(f->name(), w);
      w.StartArray();
      for (int i = 0; i < r->FieldSize(m, f); ++i) WriteValue(m, f, i, w);
      w.EndArray();
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE || f->containing_oneof()) {
      if (!r->HasField(m, f)) continue;  // an unset message or oneof member is absent
      WriteKey(f->name(), w);
      WriteValue(m, f, -1, w);
    } else {
      WriteKey(f->name(), w);
      WriteValue(m, f, -1, w);
    }
  }
  w.EndObject();
}

void WriteParameters(const Params& params, JsonWriter& w) {
  w.StartObject();
  for (const auto& [key, p] : params) {
    WriteKey(key, w);
    WriteParameter(p, w);
  }
  w.EndObject();
}

absl::Status ReadParameters(const rapidjson::Value& v, absl::string_view where, Params* out) {
  if (!v.IsObject()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'parameters' must be an object"));
  }
  for (const auto& member : v.GetObject()) {
    const std::string key(member.name.GetString(), member.name.GetStringLength());
    const rapidjson::Value& value = member.value;
    inference::InferParameter& p = (*out)[key];
    if (value.IsBool()) {
      p.set_bool_param(value.GetBool());
    } else if (value.IsInt64()) {
      p.set_int64_param(value.GetInt64());
    } else if (value.IsUint64()) {
      p.set_uint64_param(value.GetUint64());
    } else if (value.IsNumber()) {
      p.set_double_param(value.GetDouble());
    } else if (value.IsString()) {
      p.set_string_param(std::string(value.GetString(), value.GetStringLength()));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": parameter '", key, "' must be a boolean, a number or a string"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckParsed(const rapidjson::ParseResult& result, absl::string_view what,
                         const rapidjson::Document& doc) {
  if (result.IsError()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the body is not JSON: ",
                                                   rapidjson::GetParseError_En(result.Code()),
                                                   " (at byte ", result.Offset(), ")"));
  }
  if (!doc.IsObject()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the body must be a JSON object"));
  }
  return absl::OkStatus();
}

absl::Status ParseJson(absl::string_view body, absl::string_view what, rapidjson::Document* doc) {
  doc->Parse<kJsonParseFlags>(body.data(), body.size());
  return CheckParsed(*doc, what, *doc);
}

absl::Status ReadMessage(absl::string_view body, absl::string_view what, Message* m) {
  if (body.empty()) return absl::OkStatus();
  rapidjson::Document doc;
  RETURN_IF_ERROR(ParseJson(body, what, &doc));
  const Reflection* r = m->GetReflection();
  for (const auto& member : doc.GetObject()) {
    const std::string name(member.name.GetString(), member.name.GetStringLength());
    const rapidjson::Value& v = member.value;
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(name);
    if (f == nullptr || f->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown field '", name, "'"));
    }
    auto wrong = [&](absl::string_view want) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", name, "' must be ", want));
    };
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        if (!v.IsInt()) return wrong("an integer");
        r->SetInt32(m, f, v.GetInt());
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        if (!v.IsInt64()) return wrong("an integer");
        r->SetInt64(m, f, v.GetInt64());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        if (!v.IsUint()) return wrong("a non-negative integer");
        r->SetUInt32(m, f, v.GetUint());
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        if (!v.IsUint64()) return wrong("a non-negative integer");
        r->SetUInt64(m, f, v.GetUint64());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        if (!v.IsBool()) return wrong("true or false");
        r->SetBool(m, f, v.GetBool());
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (f->type() == FieldDescriptor::TYPE_BYTES) {
          std::string decoded;
          if (!v.IsObject() || !v.HasMember("b64") || !v["b64"].IsString() ||
              !absl::Base64Unescape(
                  absl::string_view(v["b64"].GetString(), v["b64"].GetStringLength()), &decoded)) {
            return wrong("{\"b64\": \"<base64>\"}");
          }
          r->SetString(m, f, std::move(decoded));
        } else {
          if (!v.IsString()) return wrong("a string");
          r->SetString(m, f, std::string(v.GetString(), v.GetStringLength()));
        }
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(what, ": unknown field '", name, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace opserve::http
