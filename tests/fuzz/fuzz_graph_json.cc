// Fuzz target: the CLI's graph-JSON reader.
//
// Bytes are a graph file's text. Relative {"npy": PATH} entries resolve in a private directory
// that LLVMFuzzerInitialize fills with a few .npy files (valid, truncated, v2.0, a scalar), so the
// file loader (ReadNpyFile) is fuzzed too. Inputs whose npy paths are absolute or climb out with
// ".." are skipped: the CLI reads whatever file the user names, and a fuzzer must not.
//
// Checks, beyond "no crash, leak or hang":
//   - a refusal is INVALID_ARGUMENT, NOT_FOUND or UNAVAILABLE (a missing or unreadable file)
//     with a message;
//   - an accepted graph round-trips: proto JSON of the result parses back to the same request.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/graph_json.h"
#include "client/host_tensor.h"
#include "client/npy.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace pb = google::protobuf;
using opserve::client::HostTensor;

const absl::StatusCode kRefusals[] = {absl::StatusCode::kInvalidArgument,
                                      absl::StatusCode::kNotFound,
                                      absl::StatusCode::kUnavailable};

std::string& FixtureDir() {
  static std::string* dir = new std::string();
  return *dir;
}

void WriteFile(const std::string& name, const std::string& bytes) {
  std::ofstream out(FixtureDir() + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();
}

std::string Npy(opserve::v1::DType dtype, std::vector<int64_t> shape, uint64_t element_bytes) {
  HostTensor t{dtype, std::move(shape), {}};
  uint64_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  for (uint64_t i = 0; i < n * element_bytes; ++i) t.data += static_cast<char>(i % 7);
  return *opserve::client::SerializeNpy(t);
}

void MakeFixture() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/opserve-fuzz-graph-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  FixtureDir() = pattern;
  WriteFile("a.npy", Npy(opserve::v1::FLOAT32, {2, 3}, 4));
  WriteFile("b.npy", Npy(opserve::v1::FLOAT32, {3, 2}, 4));
  WriteFile("i.npy", Npy(opserve::v1::INT32, {4}, 4));
  WriteFile("l.npy", Npy(opserve::v1::INT64, {2, 2}, 8));
  WriteFile("s.npy", Npy(opserve::v1::FLOAT32, {}, 4));
  std::string truncated = Npy(opserve::v1::FLOAT32, {4, 4}, 4);
  truncated.resize(truncated.size() - 5);
  WriteFile("short.npy", truncated);
  WriteFile("empty.npy", "");
  WriteFile("text.npy", "{\"not\": \"npy\"}\n");
  std::filesystem::create_directory(FixtureDir() + "/sub");
  WriteFile("sub/c.npy", Npy(opserve::v1::FLOAT32, {1, 5}, 4));
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(FixtureDir(), ignored);
  });
}

// Whether every {"npy": PATH} under inline tensors stays inside the fixture directory.
bool NpyPathsAreContained(const pb::Value& root) {
  if (!root.has_struct_value()) return true;
  for (const char* key : {"inlineTensors", "inline_tensors"}) {
    auto it = root.struct_value().fields().find(key);
    if (it == root.struct_value().fields().end() || !it->second.has_struct_value()) continue;
    for (const auto& [name, value] : it->second.struct_value().fields()) {
      if (!value.has_struct_value()) continue;
      auto npy = value.struct_value().fields().find("npy");
      if (npy == value.struct_value().fields().end() || !npy->second.has_string_value()) continue;
      const std::filesystem::path path(npy->second.string_value());
      if (path.is_absolute()) return false;
      for (const auto& part : path) {
        if (part == "..") return false;
      }
    }
  }
  return true;
}

std::string Canonical(const pb::Message& m) {
  std::string out;
  pb::io::StringOutputStream stream(&out);
  pb::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  opserve::fuzz::SilenceProtobufLogs();
  MakeFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  {
    pb::Value root;
    if (pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &root).ok() &&
        !NpyPathsAreContained(root)) {
      return 0;
    }
  }

  auto request = opserve::client::ParseGraphJson(json, FixtureDir(), "fuzz.json");
  if (!request.ok()) {
    FUZZ_CHECK(opserve::fuzz::ErrorIsOneOf(request.status(), kRefusals),
               request.status().ToString());
    return 0;
  }

  std::string text;
  FUZZ_CHECK(pb::util::MessageToJsonString(*request, &text).ok(), "MessageToJsonString");
  auto again = opserve::client::ParseGraphJson(text, FixtureDir(), "round-trip.json");
  FUZZ_CHECK(again.ok(), again.status().ToString() + "\n  for " + text);
  FUZZ_CHECK(Canonical(*again) == Canonical(*request), "the round trip changed the request: " + text);
  return 0;
}
