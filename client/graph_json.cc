#include "client/graph_json.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/json_syntax.h"
#include "client/npy.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "common/status_macros.h"  // header only: the macros, no link to opserve_core

namespace opserve::client {
namespace {

namespace pb = google::protobuf;

// JSON numbers pass through google.protobuf.Value as doubles, which hold integers exactly only
// below 2^53. The request's int64 fields (attr "i", tensor "shape") must have larger values
// quoted, as proto JSON writes them anyway; double fields ("f") take any number.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53: 2^53 + 1 parses to it

// An ExecuteRequest nests 6 JSON levels at most ($.nodes[0].attrs.k.i). protobuf's parser takes
// deeper text into a Value, but cannot print it back past about 32 levels: refuse it here, as
// the bad input it is, with a clear message.
constexpr int kMaxJsonDepth = 16;

absl::Status Invalid(absl::string_view source, absl::string_view json_path,
                     absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", json_path, ": ", what));
}

absl::string_view KindName(const pb::Value& value) {
  switch (value.kind_case()) {
    case pb::Value::kNullValue:
      return "null";
    case pb::Value::kNumberValue:
      return "a number";
    case pb::Value::kStringValue:
      return "a string";
    case pb::Value::kBoolValue:
      return "a bool";
    case pb::Value::kStructValue:
      return "an object";
    case pb::Value::kListValue:
      return "a list";
    default:
      return "nothing";
  }
}

absl::Status CheckDepth(const pb::Value& value, const std::string& json_path, int depth,
                        absl::string_view source) {
  if (depth > kMaxJsonDepth) {
    return Invalid(source, json_path,
                   absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels: not a graph"));
  }
  if (value.has_struct_value()) {
    for (const auto& [key, field] : value.struct_value().fields()) {
      RETURN_IF_ERROR(CheckDepth(field, absl::StrCat(json_path, ".", key), depth + 1, source));
    }
  } else if (value.has_list_value()) {
    for (int i = 0; i < value.list_value().values_size(); ++i) {
      RETURN_IF_ERROR(CheckDepth(value.list_value().values(i), absl::StrCat(json_path, "[", i, "]"),
                                 depth + 1, source));
    }
  }
  return absl::OkStatus();
}

// `value` (if a number) is bound for an int64 field.
absl::Status CheckExactInteger(const pb::Value& value, const std::string& json_path,
                               absl::string_view source) {
  if (value.has_number_value() && std::fabs(value.number_value()) >= kMaxExactInteger) {
    return Invalid(source, json_path,
                   "integers from 2^53 up lose precision as JSON numbers: write them as strings");
  }
  return absl::OkStatus();
}

// Walks the int64 fields of ExecuteRequest: $.nodes[*].attrs.*.i and $.inlineTensors.*.shape[*].
// Anything shaped otherwise is left for the proto parser to refuse.
absl::Status CheckInt64Fields(const pb::Struct& root, absl::string_view source) {
  const auto& fields = root.fields();
  if (auto nodes = fields.find("nodes"); nodes != fields.end() && nodes->second.has_list_value()) {
    for (int n = 0; n < nodes->second.list_value().values_size(); ++n) {
      const pb::Value& node = nodes->second.list_value().values(n);
      if (!node.has_struct_value()) continue;
      auto attrs = node.struct_value().fields().find("attrs");
      if (attrs == node.struct_value().fields().end() || !attrs->second.has_struct_value())
        continue;
      for (const auto& [key, attr] : attrs->second.struct_value().fields()) {
        if (!attr.has_struct_value()) continue;
        auto i = attr.struct_value().fields().find("i");
        if (i == attr.struct_value().fields().end()) continue;
        RETURN_IF_ERROR(CheckExactInteger(
            i->second, absl::StrCat("$.nodes[", n, "].attrs.", key, ".i"), source));
      }
    }
  }
  for (const char* spelling : {"inlineTensors", "inline_tensors"}) {
    auto tensors = fields.find(spelling);
    if (tensors == fields.end() || !tensors->second.has_struct_value()) continue;
    for (const auto& [name, tensor] : tensors->second.struct_value().fields()) {
      if (!tensor.has_struct_value()) continue;
      auto shape = tensor.struct_value().fields().find("shape");
      if (shape == tensor.struct_value().fields().end() || !shape->second.has_list_value())
        continue;
      for (int d = 0; d < shape->second.list_value().values_size(); ++d) {
        RETURN_IF_ERROR(
            CheckExactInteger(shape->second.list_value().values(d),
                              absl::StrCat("$.", spelling, ".", name, ".shape[", d, "]"), source));
      }
    }
  }
  return absl::OkStatus();
}

// Takes every {"npy": PATH} entry out of `inline_tensors` and loads it into `loaded`.
absl::Status ExtractNpyTensors(pb::Struct* inline_tensors, const std::string& json_path,
                               const std::string& base_dir, absl::string_view source,
                               std::vector<std::pair<std::string, HostTensor>>* loaded) {
  std::vector<std::string> taken;
  for (const auto& [name, value] : inline_tensors->fields()) {
    const std::string entry_path = absl::StrCat(json_path, ".", name);
    if (!value.has_struct_value()) {
      return Invalid(source, entry_path,
                     absl::StrCat("expected a Tensor object or {\"npy\": \"file.npy\"}, found ",
                                  KindName(value)));
    }
    const auto& fields = value.struct_value().fields();
    const auto npy = fields.find("npy");
    if (npy == fields.end()) continue;  // a plain Tensor: the proto parser checks it
    if (fields.size() != 1) {
      return Invalid(source, entry_path,
                     "an {\"npy\": ...} entry takes no other fields (dtype and shape come from "
                     "the file)");
    }
    if (!npy->second.has_string_value() || npy->second.string_value().empty()) {
      return Invalid(source, entry_path + ".npy",
                     absl::StrCat("expected a file path string, found ", KindName(npy->second)));
    }
    std::filesystem::path file(npy->second.string_value());
    if (file.is_relative()) file = std::filesystem::path(base_dir) / file;
    absl::StatusOr<HostTensor> tensor = ReadNpyFile(file.string());
    if (!tensor.ok()) {
      return absl::Status(
          tensor.status().code(),
          absl::StrCat(source, ": ", entry_path, ".npy: ", tensor.status().message()));
    }
    loaded->emplace_back(name, *std::move(tensor));
    taken.push_back(name);
  }
  for (const std::string& name : taken) inline_tensors->mutable_fields()->erase(name);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ExecuteRequest> ParseGraphJson(absl::string_view json,
                                                  const std::string& base_dir,
                                                  absl::string_view source) {
  RETURN_IF_ERROR(CheckJsonSyntax(json, source));
  pb::Value root;
  pb::util::Status parsed =
      pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid JSON: ", parsed.message().as_string()));
  }
  if (!root.has_struct_value()) {
    return Invalid(source, "$", absl::StrCat("expected an object, found ", KindName(root)));
  }
  RETURN_IF_ERROR(CheckDepth(root, "$", 0, source));
  RETURN_IF_ERROR(CheckInt64Fields(root.struct_value(), source));

  // Proto JSON accepts both the lowerCamelCase name and the proto field name.
  std::vector<std::pair<std::string, HostTensor>> loaded;
  auto* fields = root.mutable_struct_value()->mutable_fields();
  for (const char* key : {"inlineTensors", "inline_tensors"}) {
    auto it = fields->find(key);
    if (it == fields->end()) continue;
    const std::string json_path = absl::StrCat("$.", key);
    if (!it->second.has_struct_value()) {
      return Invalid(
          source, json_path,
          absl::StrCat("expected an object of named tensors, found ", KindName(it->second)));
    }
    RETURN_IF_ERROR(
        ExtractNpyTensors(it->second.mutable_struct_value(), json_path, base_dir, source, &loaded));
  }

  // What is left is plain proto JSON: let protobuf's parser check it against ExecuteRequest.
  // The .npy tensors skip this round trip (base64 would double their size) and go in directly.
  std::string remaining;
  parsed = pb::util::MessageToJsonString(root, &remaining);
  if (!parsed.ok()) {  // the checks above should leave nothing for this to refuse
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot re-encode the graph: ", parsed.message().as_string()));
  }
  v1::ExecuteRequest request;
  parsed = pb::util::JsonStringToMessage(remaining, &request);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a valid ExecuteRequest: ", parsed.message().as_string()));
  }
  for (auto& [name, tensor] : loaded) {
    if (request.inline_tensors().contains(name)) {
      return Invalid(source, "$.inlineTensors",
                     absl::StrCat("tensor '", name, "' is given under both spellings"));
    }
    (*request.mutable_inline_tensors())[name] = ToProto(std::move(tensor));
  }
  return request;
}

absl::StatusOr<v1::ExecuteRequest> LoadGraphFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a graph file"));
  }
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    // ifstream keeps no reason of its own; open(2) left it in errno.
    const int err = errno;
    const std::string message =
        absl::StrCat(path, ": ", err != 0 ? std::strerror(err) : "cannot open the graph file");
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::NotFoundError(message);
  }
  std::stringstream text;
  errno = 0;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot read: ", std::strerror(errno != 0 ? errno : EIO)));
  }
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return ParseGraphJson(text.str(), base_dir.empty() ? "." : base_dir, path);
}

}  // namespace opserve::client
