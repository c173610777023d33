// Protobuf messages of the Open Inference Protocol as its HTTP/REST binding writes them in JSON
// (the shapes Triton's HTTP endpoints answer with), and the few request bodies it reads. Built
// on RapidJSON; the messages are walked through protobuf's reflection, so a field added to
// proto/inference/grpc_service.proto reaches the HTTP answers with no edit here.
#pragma once

#include <google/protobuf/map.h>
#include <google/protobuf/message.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"

namespace opserve::http {

// NaN and infinities as JSON's common extension (NaN, Infinity): an op may return them, and
// Python's json module reads them.
using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                     rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;
// Iterative: a body nested thousands deep must not exhaust a request thread's stack.
inline constexpr unsigned kJsonParseFlags =
    rapidjson::kParseNanAndInfFlag | rapidjson::kParseIterativeFlag;

using Params = google::protobuf::Map<std::string, inference::InferParameter>;

// `m` as one JSON object: fields by their proto names, every scalar (defaults too, as Triton's
// always_print_primitive_fields does), 64-bit integers as numbers, enums by name, maps as
// objects, an InferParameter as its one value.
void WriteMessage(const google::protobuf::Message& m, JsonWriter& w);
void WriteParameters(const Params& params, JsonWriter& w);

// A JSON "parameters" object into `out`: booleans, integers (int64_param, uint64_param past
// INT64_MAX), other numbers (double_param) and strings. INVALID_ARGUMENT naming `where` and
// the key for anything else.
absl::Status ReadParameters(const rapidjson::Value& v, absl::string_view where, Params* out);

// A request body (an object of the message's scalar fields by their proto names; bytes as
// {"b64": "..."}, as Triton's raw_handle is) into `m`. INVALID_ARGUMENT naming the field for a
// field the message lacks or a value of the wrong type. An empty body leaves `m` as it is.
absl::Status ReadMessage(absl::string_view body, absl::string_view what,
                         google::protobuf::Message* m);

// The body as a JSON document, or INVALID_ARGUMENT with RapidJSON's reason and offset.
absl::Status ParseJson(absl::string_view body, absl::string_view what, rapidjson::Document* doc);
// ParseJson's errors for a parse's `result` and the document it gave (which must be an object).
absl::Status CheckParsed(const rapidjson::ParseResult& result, absl::string_view what,
                         const rapidjson::Document& doc);

}  // namespace opserve::http
