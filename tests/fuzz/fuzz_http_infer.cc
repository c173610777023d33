// Fuzz target: InferRequestFromHttp (server/http/infer_body.h), the HTTP infer endpoint's body:
// the JSON header, then the binary tensor data that its inputs' binary_data_size claim.
//
// Input layout: bytes 0-1 (little-endian) modulo the rest's length + 1 are the JSON header's
// length, as Inference-Header-Content-Length gives it; the rest of the input after the header is
// the binary part, handed out through the ReadBinary callback as the endpoint's Exchange does.
//
// Invariants, beyond "no crash, leak or hang":
//   - a refusal is INVALID_ARGUMENT with a message;
//   - the callback is never asked for more bytes than the binary part holds, and on success it
//     was asked for all of them;
//   - where RapidJSON's Document refuses the header, the answer is ParseJson's error, word for
//     word (the one-pass parse reports what a whole-document parse did);
//   - on success, each input's bytes are what the Document path gives: binary data as it came,
//     and "data" as EncodeData encodes the Document's value, whether the one pass took it or not.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "server/http/infer_body.h"
#include "server/http/infer_json.h"
#include "server/http/json_proto.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using opserve::http::InferHttpRequest;
using opserve::http::RawInput;

std::string Bytes(const RawInput& raw) {
  std::string out;
  for (std::string_view p : raw.pieces) out.append(p);
  FUZZ_CHECK(out.size() == raw.bytes, "a raw input's pieces differ from its byte count");
  return out;
}

// Each input's bytes on the Document path, in the order of `raw`.
void CheckAgainstDocument(const rapidjson::Document& doc, std::string_view binary,
                          const InferHttpRequest& req) {
  const auto inputs = doc.FindMember("inputs");
  FUZZ_CHECK(inputs != doc.MemberEnd() && inputs->value.IsArray(), "accepted without inputs");
  size_t r = 0;
  uint64_t at = 0;
  for (const rapidjson::Value& in : inputs->value.GetArray()) {
    FUZZ_CHECK(in.IsObject(), "accepted an input that is no object");
    const auto params = in.FindMember("parameters");
    const auto data = in.FindMember("data");
    if (params != in.MemberEnd() && params->value.IsObject() &&
        params->value.HasMember("binary_data_size")) {
      FUZZ_CHECK(r < req.raw.size(), "a binary input without its raw entry");
      const std::string got = Bytes(req.raw[r++]);
      FUZZ_CHECK(binary.substr(at, got.size()) == got, "binary data out of place");
      at += got.size();
      continue;
    }
    if (data == in.MemberEnd()) continue;
    const auto datatype = in.FindMember("datatype");
    FUZZ_CHECK(datatype != in.MemberEnd() && datatype->value.IsString(), "accepted no datatype");
    const std::optional<opserve::DType> dtype = opserve::DTypeFromOipName(
        {datatype->value.GetString(), datatype->value.GetStringLength()});
    if (!dtype.has_value()) continue;
    std::string want;
    const absl::Status s = opserve::http::EncodeData(data->value, *dtype, "input", &want);
    FUZZ_CHECK(s.ok(), absl::StrCat("accepted data the Document path refuses: ", s.message()));
    FUZZ_CHECK(r < req.raw.size(), "a data input without its raw entry");
    FUZZ_CHECK(Bytes(req.raw[r++]) == want, "data encoded unlike the Document path's");
  }
  FUZZ_CHECK(r == req.raw.size(), "raw entries no input accounts for");
  FUZZ_CHECK(at == binary.size(), "binary data no input accounts for");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t header_bytes = (data[0] | data[1] << 8) % (rest.size() + 1);
  const std::string_view header = rest.substr(0, header_bytes);
  const std::string_view binary = rest.substr(header_bytes);

  uint64_t handed = 0;
  auto read = [&](char* dst, uint64_t n) {
    FUZZ_CHECK(n <= binary.size() - handed, "asked for bytes past the binary part");
    binary.copy(dst, n, handed);
    handed += n;
    return absl::OkStatus();
  };
  InferHttpRequest req;
  const absl::Status s = opserve::http::InferRequestFromHttp(header, binary.size(), read, &req);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument && !s.message().empty(),
               s.ToString());
  } else {
    FUZZ_CHECK(handed == binary.size(), "accepted with binary data unread");
  }

  rapidjson::Document doc;
  const absl::Status parsed = opserve::http::ParseJson(
      absl::string_view(header.data(), header.size()), "infer request", &doc);
  if (!parsed.ok()) {
    FUZZ_CHECK(s == parsed, absl::StrCat("Document: ", parsed.ToString(), "; one pass: ",
                                         s.ToString()));
  } else if (s.ok()) {
    CheckAgainstDocument(doc, binary, req);
  }
  return 0;
}
