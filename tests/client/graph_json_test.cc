// Graph files: plain proto JSON, the {"npy": ...} extension and the errors, which must name the
// file, the JSON path and what was wrong.
#include "client/graph_json.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "client/json_syntax.h"
#include "client/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserve::client {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A fresh directory per test, holding the graph and its .npy files.
class GraphJsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unique to this test and process: ctest runs tests in parallel, and TempDir() is shared.
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("graph_json.") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "." +
            std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    HostTensor b;
    b.dtype = v1::FLOAT32;
    b.shape = {2, 2};
    b.data = std::string("\0\0\x80\x3f\0\0\0\x40\0\0\x40\x40\0\0\x80\x40", 16);  // 1 2 3 4
    ASSERT_TRUE(WriteNpyFile((dir_ / "b.npy").string(), b).ok());
  }

  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteGraph(const std::string& json) {
    const std::string path = (dir_ / "graph.json").string();
    std::ofstream(path) << json;
    return path;
  }

  void ExpectError(const std::string& json, absl::StatusCode code,
                   const std::vector<std::string>& texts) {
    const std::string path = WriteGraph(json);
    absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(path);
    ASSERT_FALSE(request.ok()) << "accepted: " << json;
    EXPECT_EQ(request.status().code(), code) << request.status();
    EXPECT_THAT(std::string(request.status().message()), HasSubstr(path + ":"));
    for (const std::string& text : texts) {
      EXPECT_THAT(std::string(request.status().message()), HasSubstr(text));
    }
  }

  std::filesystem::path dir_;
};

TEST_F(GraphJsonTest, ParsesProtoJson) {
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(WriteGraph(R"({
    "nodes": [
      {"id": "mm", "op": "matmul", "algorithm": "tiled",
       "inputs": [{"stored": "A"}, {"inlineName": "B"}],
       "attrs": {"k": {"i": "3"}, "alpha": {"f": 0.5}, "mode": {"s": "x"}, "flag": {"b": true}}},
      {"id": "mean", "op": "row_mean", "inputs": [{"node": "mm"}]}
    ],
    "inlineTensors": {"B": {"dtype": "FLOAT32", "shape": ["1"], "data": "AACAPw=="}},
    "outputs": [{"node": "mean", "returnInline": true},
                {"node": "mm", "storeAs": "AB", "overwrite": true}]
  })"));
  ASSERT_TRUE(request.ok()) << request.status();
  ASSERT_EQ(request->nodes_size(), 2);
  EXPECT_EQ(request->nodes(0).inputs(0).stored(), "A");
  EXPECT_EQ(request->nodes(0).inputs(1).inline_name(), "B");
  EXPECT_EQ(request->nodes(0).attrs().at("k").i(), 3);
  EXPECT_EQ(request->nodes(0).attrs().at("alpha").f(), 0.5);
  EXPECT_TRUE(request->nodes(0).attrs().at("flag").b());
  EXPECT_EQ(request->nodes(1).inputs(0).node(), "mm");
  EXPECT_EQ(request->inline_tensors().at("B").data(), std::string("\0\0\x80\x3f", 4));
  EXPECT_TRUE(request->outputs(0).return_inline());
  EXPECT_EQ(request->outputs(1).store_as(), "AB");
}

// An output's "device" names where store_as keeps it, on a server of several devices.
TEST_F(GraphJsonTest, OutputsTakeADevice) {
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(WriteGraph(R"({
    "nodes": [{"id": "t", "op": "transpose", "inputs": [{"stored": "A"}]}],
    "outputs": [{"node": "t", "storeAs": "AT", "device": "cuda:1"},
                {"node": "t", "return_inline": true}]
  })"));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->outputs(0).device(), "cuda:1");
  EXPECT_EQ(request->outputs(1).device(), "");
  ExpectError(R"({"outputs": [{"node": "t", "device": 1}]})", absl::StatusCode::kInvalidArgument,
              {"device"});
}

TEST_F(GraphJsonTest, AcceptsProtoFieldNames) {
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(WriteGraph(R"({
    "nodes": [{"id": "t", "op": "transpose", "inputs": [{"inline_name": "B"}]}],
    "inline_tensors": {"B": {"npy": "b.npy"}},
    "outputs": [{"node": "t", "return_inline": true}]
  })"));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->inline_tensors().at("B").shape_size(), 2);
  EXPECT_TRUE(request->outputs(0).return_inline());
}

TEST_F(GraphJsonTest, LoadsNpyRelativeToTheGraphAndAbsolute) {
  const std::string absolute = (dir_ / "b.npy").string();
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(WriteGraph(
      R"({"inlineTensors": {"B": {"npy": "b.npy"}, "C": {"npy": ")" + absolute + R"("}}})"));
  ASSERT_TRUE(request.ok()) << request.status();
  for (const char* name : {"B", "C"}) {
    const v1::Tensor& tensor = request->inline_tensors().at(name);
    EXPECT_EQ(tensor.dtype(), v1::FLOAT32);
    EXPECT_THAT(tensor.shape(), ::testing::ElementsAre(2, 2));
    EXPECT_EQ(tensor.data().size(), 16u);
    EXPECT_EQ(tensor.data().substr(0, 4), std::string("\0\0\x80\x3f", 4));
  }
}

TEST_F(GraphJsonTest, MixesNpyAndPlainTensors) {
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(WriteGraph(
      R"({"inlineTensors": {"B": {"npy": "b.npy"}, "S": {"dtype": "INT64", "data": "AQAAAAAAAAA="}}})"));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->inline_tensors().size(), 2u);
  EXPECT_EQ(request->inline_tensors().at("S").dtype(), v1::INT64);
}

TEST_F(GraphJsonTest, SyntaxErrors) {
  ExpectError(R"({"nodes": [)", absl::StatusCode::kInvalidArgument, {"not valid JSON"});
  ExpectError(R"([1, 2])", absl::StatusCode::kInvalidArgument,
              {"$: expected an object, found a list"});
}

// protobuf's parser says only "Unexpected token."; the file's own line and column come first.
TEST_F(GraphJsonTest, SyntaxErrorsGiveLineAndColumn) {
  ExpectError("{\"nodes\": [\n  {\"id\": \"x\",\n   \"op\": sum}]}",
              absl::StatusCode::kInvalidArgument,
              {"graph.json:3:10: not valid JSON: expected a value, found 's'"});
  ExpectError(R"({"a": 1,})", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:9: ", "expected a member name in double quotes, found '}'"});
  ExpectError(R"({"a": [1 2]})", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:10: ", "expected ',' or ']' after a list element, found '2'"});
  ExpectError("{\"a\": \"x", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:9: ", "to end the string, found the end of the text"});
  ExpectError("{} x", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:4: ", "expected the end of the text after the value, found 'x'"});
  ExpectError("{\"a\": \"\\q\"}", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:9: ", "expected an escape"});
  ExpectError("{\"a\": \"tab\there\"}", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:11: ", "control characters must be escaped", "byte 0x09"});
  ExpectError("{\"a\": 01}", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:8: ", "expected ',' or '}' after an object member, found '1'"});
  ExpectError("{\"a\": -}", absl::StatusCode::kInvalidArgument, {"graph.json:1:8: "});
  ExpectError("{\"a\": 1.e5}", absl::StatusCode::kInvalidArgument, {"graph.json:1:9: "});
  ExpectError("\r\n\n  {\"a\": tru}", absl::StatusCode::kInvalidArgument,
              {"graph.json:3:12: ", "expected 'true', found '}'"});
  ExpectError("", absl::StatusCode::kInvalidArgument,
              {"graph.json:1:1: ", "expected a value, found the end of the text"});
}

TEST(JsonSyntax, AcceptsWhatRfc8259Allows) {
  for (const char* json :
       {R"({})", R"([])", R"(0)", R"(-0.5e-3)", R"(1E+10)", R"("")", R"(null)",
        R"({"a": [true, false, null, 1, -2.5, "s\"\\\/\b\f\n\r\t\u00e9"], "b": {"c": {}}})",
        " \t\r\n{\"k\" : [ 1 , 2 ] }\n", "\"\xc3\xa9 multi-byte UTF-8 passes\""}) {
    EXPECT_TRUE(CheckJsonSyntax(json, "t").ok()) << json << ": " << CheckJsonSyntax(json, "t");
  }
  // Nesting past the checker's bound is refused, not followed down the stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THAT(std::string(CheckJsonSyntax(deep, "t").message()), HasSubstr("levels of nesting"));
}

TEST_F(GraphJsonTest, NpyExtensionErrors) {
  ExpectError(R"({"inlineTensors": [1]})", absl::StatusCode::kInvalidArgument,
              {"$.inlineTensors: expected an object of named tensors, found a list"});
  ExpectError(
      R"({"inlineTensors": {"B": "b.npy"}})", absl::StatusCode::kInvalidArgument,
      {"$.inlineTensors.B: expected a Tensor object or {\"npy\": \"file.npy\"}, found a string"});
  ExpectError(R"({"inlineTensors": {"B": {"npy": 3}}})", absl::StatusCode::kInvalidArgument,
              {"$.inlineTensors.B.npy: expected a file path string, found a number"});
  ExpectError(R"({"inlineTensors": {"B": {"npy": "b.npy", "dtype": "FLOAT32"}}})",
              absl::StatusCode::kInvalidArgument,
              {"$.inlineTensors.B: an {\"npy\": ...} entry takes no other fields"});
  ExpectError(R"({"inlineTensors": {"B": {"npy": "missing.npy"}}})", absl::StatusCode::kNotFound,
              {"$.inlineTensors.B.npy: ", "missing.npy: cannot open"});
  std::ofstream((dir_ / "bad.npy").string()) << "not numpy";
  ExpectError(R"({"inlineTensors": {"B": {"npy": "bad.npy"}}})", absl::StatusCode::kInvalidArgument,
              {"$.inlineTensors.B.npy: ", "bad.npy: not a .npy file"});
}

TEST_F(GraphJsonTest, ProtoErrorsNameTheField) {
  ExpectError(R"({"nodes": [{"id": "x", "opp": "sum"}]})", absl::StatusCode::kInvalidArgument,
              {"not a valid ExecuteRequest", "opp"});
  ExpectError(R"({"inlineTensors": {"B": {"dtype": "FLOAT99"}}})",
              absl::StatusCode::kInvalidArgument, {"not a valid ExecuteRequest", "FLOAT99"});
}

TEST_F(GraphJsonTest, RefusesNumbersThatLosePrecision) {
  ExpectError(R"({"nodes": [{"id": "x", "attrs": {"k": {"i": 9007199254740993}}}]})",
              absl::StatusCode::kInvalidArgument,
              {"$.nodes[0].attrs.k.i: integers from 2^53 up lose precision"});
  ExpectError(R"({"inlineTensors": {"B": {"dtype": "INT32", "shape": [1e17]}}})",
              absl::StatusCode::kInvalidArgument,
              {"$.inlineTensors.B.shape[0]: integers from 2^53 up lose precision"});
}

TEST_F(GraphJsonTest, DoubleFieldsTakeAnyNumber) {
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile(WriteGraph(
      R"({"nodes": [{"id": "x", "attrs": {"f": {"f": 1e300}, "i": {"i": "9007199254740993"}}}]})"));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->nodes(0).attrs().at("f").f(), 1e300);
  EXPECT_EQ(request->nodes(0).attrs().at("i").i(), 9007199254740993);
}

TEST_F(GraphJsonTest, RefusesDeepNesting) {
  std::string deep = "1";
  for (int i = 0; i < 40; ++i) deep = "[" + deep + "]";
  ExpectError(R"({"nodes": )" + deep + "}", absl::StatusCode::kInvalidArgument,
              {"nested deeper than 16 levels"});
  deep = "1";
  for (int i = 0; i < 200; ++i) deep = "{\"a\": " + deep + "}";
  const std::string path = WriteGraph(deep);
  EXPECT_EQ(LoadGraphFile(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GraphJsonTest, MissingGraphFile) {
  absl::StatusOr<v1::ExecuteRequest> request = LoadGraphFile((dir_ / "nope.json").string());
  EXPECT_EQ(request.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(request.status().message()), HasSubstr("nope.json: No such file or directory"));
}

}  // namespace
}  // namespace opserve::client
