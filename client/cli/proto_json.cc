#include "client/cli/proto_json.h"

#include <cmath>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/format.h"
#include "google/protobuf/descriptor.h"

namespace opserve::cli {
namespace {

namespace pb = google::protobuf;
using FieldDescriptor = pb::FieldDescriptor;

void AppendMessage(const pb::Message& message, std::string* out);

std::string Double(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  // The shortest of %.15g and %.17g that reads back as the same double, as protobuf's own
  // printer does: 1.532, not 1.5319999999999998.
  const std::string brief = absl::StrFormat("%.15g", value);
  double back = 0;
  if (absl::SimpleAtod(brief, &back) && back == value) return brief;
  return absl::StrFormat("%.17g", value);
}

// One value of `field`: element `index` of a repeated field, or the singular value (index -1).
void AppendValue(const pb::Message& message, const FieldDescriptor* field, int index,
                 std::string* out) {
  const pb::Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(out, rep ? r->GetRepeatedInt32(message, field, index)
                               : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(out, rep ? r->GetRepeatedInt64(message, field, index)
                               : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt32(message, field, index)
                               : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt64(message, field, index)
                               : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      *out += Double(rep ? r->GetRepeatedDouble(message, field, index)
                         : r->GetDouble(message, field));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      // Through %.9g, not a widening to double: 0.1f prints as 0.100000001, not 0.10000000149...
      {
        const float value = rep ? r->GetRepeatedFloat(message, field, index)
                                : r->GetFloat(message, field);
        *out += std::isfinite(value) ? absl::StrFormat("%.9g", value) : Double(value);
      }
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      *out += (rep ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                  ? "true"
                  : "false";
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number = rep ? r->GetRepeatedEnumValue(message, field, index)
                             : r->GetEnumValue(message, field);
      const pb::EnumValueDescriptor* value = field->enum_type()->FindValueByNumber(number);
      // A number this build does not know prints as the number, as proto JSON does.
      *out += value != nullptr ? JsonQuote(value->name()) : absl::StrCat(number);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& text =
          rep ? r->GetRepeatedStringReference(message, field, index, &scratch)
              : r->GetStringReference(message, field, &scratch);
      *out += field->type() == FieldDescriptor::TYPE_BYTES
                  ? absl::StrCat("\"", absl::Base64Escape(text), "\"")
                  : JsonQuote(text);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      AppendMessage(rep ? r->GetRepeatedMessage(message, field, index)
                        : r->GetMessage(message, field),
                    out);
      break;
  }
}

// A map field is a repeated message of {key, value}: JSON writes it as an object, keys as strings.
void AppendMap(const pb::Message& message, const FieldDescriptor* field, std::string* out) {
  const pb::Reflection* r = message.GetReflection();
  const FieldDescriptor* key = field->message_type()->map_key();
  const FieldDescriptor* value = field->message_type()->map_value();
  *out += "{";
  for (int i = 0; i < r->FieldSize(message, field); ++i) {
    const pb::Message& entry = r->GetRepeatedMessage(message, field, i);
    if (i) *out += ", ";
    std::string key_text;
    AppendValue(entry, key, -1, &key_text);
    if (key_text.empty() || key_text[0] != '"') key_text = JsonQuote(key_text);
    absl::StrAppend(out, key_text, ": ");
    AppendValue(entry, value, -1, out);
  }
  *out += "}";
}

void AppendMessage(const pb::Message& message, std::string* out) {
  const pb::Descriptor* descriptor = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  *out += "{";
  bool first = true;
  for (int f = 0; f < descriptor->field_count(); ++f) {
    const FieldDescriptor* field = descriptor->field(f);
    // Messages and oneof members only when set; scalars and lists always, as proto JSON's
    // always_print_primitive_fields does.
    const bool optional_kind = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ||
                               field->containing_oneof() != nullptr ||
                               field->has_optional_keyword();
    if (!field->is_repeated() && optional_kind && !r->HasField(message, field)) continue;
    absl::StrAppend(out, first ? "" : ", ", JsonQuote(field->json_name()), ": ");
    first = false;
    if (field->is_map()) {
      AppendMap(message, field, out);
    } else if (field->is_repeated()) {
      *out += "[";
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        if (i) *out += ", ";
        AppendValue(message, field, i, out);
      }
      *out += "]";
    } else {
      AppendValue(message, field, -1, out);
    }
  }
  *out += "}";
}

}  // namespace

std::string ProtoJson(const pb::Message& message) {
  std::string out;
  AppendMessage(message, &out);
  return out;
}

}  // namespace opserve::cli
