// Requests whose bytes do not parse as their message, sent raw (grpc::GenericStub, bytes built
// here) to the real server: a proto3 `string` field holding invalid UTF-8, and wire data cut
// short. Each RPC answers INVALID_ARGUMENT naming itself and the field or the fault (gRPC's
// generated handlers would answer UNIMPLEMENTED with an empty message, server/request_parsing.h),
// stores nothing, and the server keeps serving.
#include <chrono>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

// Bytes that are not UTF-8: a lone continuation byte and an invalid lead byte.
constexpr char kNotUtf8[] = "\xff\xfe";
// Stands for kNotUtf8 in a message that is serialized first (same length) and patched after.
constexpr char kPlaceholder[] = "@@";

// `message` serialized, with each kPlaceholder replaced by bytes that are not UTF-8. (The
// serializer itself is never handed invalid UTF-8.)
std::string WithInvalidUtf8(const google::protobuf::Message& message) {
  return absl::StrReplaceAll(message.SerializeAsString(), {{kPlaceholder, kNotUtf8}});
}

// A length-delimited field 1 that says 5 bytes and carries 2: wire data cut short, for any of
// the requests.
const std::string kTruncated = std::string("\x0a\x05", 2) + "ab";

class MalformedRequestsTest : public OpserveTest {
 protected:
  void SetUp() override {
    OpserveTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {2, 3}, rng_), false).ok());
  }

  struct Case {
    std::string name;
    std::string method;
    std::vector<std::string> messages;
    std::vector<std::string> fragments;  // besides the method's name
  };

  void RunAll(const std::vector<Case>& cases) {
    const StoreSnapshot before = Snapshot(client());
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const RawResult r = RawCall(server().target(), c.method, c.messages);
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << r.status.error_code() << ": " << r.status.error_message();
      EXPECT_EQ(r.responses, 0);
      std::vector<std::string> fragments = c.fragments;
      fragments.push_back(c.method + ": ");
      for (const std::string& f : fragments) {
        EXPECT_NE(r.status.error_message().find(f), std::string::npos)
            << "the message \"" << r.status.error_message() << "\" does not mention " << f;
      }
      ASSERT_TRUE(Serving());
      EXPECT_TRUE(SameStore(before, Snapshot(client())));
    }
  }
};

TEST_F(MalformedRequestsTest, InvalidUtf8InAStringFieldNamesTheRpcAndTheField) {
  v1::GetTensorRequest get;
  get.set_name(kPlaceholder);
  v1::DeleteTensorRequest del;
  del.set_name(kPlaceholder);
  v1::PutTensorRequest header;
  header.mutable_header()->set_name(kPlaceholder);
  header.mutable_header()->set_dtype(v1::FLOAT32);
  header.mutable_header()->add_shape(1);
  v1::PutTensorRequest chunk;
  chunk.set_chunk(std::string(4, '\0'));

  auto execute = [](std::function<void(v1::ExecuteRequest&)> build) {
    v1::ExecuteRequest r;
    build(r);
    return WithInvalidUtf8(r);
  };
  const std::string bad_node_id = execute([](v1::ExecuteRequest& r) {
    AddNode(r, "ok", "sum", {Stored("A")});
    AddNode(r, kPlaceholder, "sum", {Stored("A")});
  });
  const std::string bad_store_as = execute([](v1::ExecuteRequest& r) {
    AddNode(r, "t", "transpose", {Stored("A")});
    AddOutput(r, "t", false, kPlaceholder);
  });
  const std::string bad_inline_key = execute([](v1::ExecuteRequest& r) {
    AddInline(r, kPlaceholder, v1::FLOAT32, {2});  // read by no node: the key alone is bad
    AddNode(r, "s", "sum", {Stored("A")});
  });
  const std::string bad_attr_string = execute([](v1::ExecuteRequest& r) {
    (*AddNode(r, "s", "sum", {Stored("A")})->mutable_attrs())["k"].set_s(kPlaceholder);
  });

  RunAll({
      {"GetTensor name", "GetTensor", {WithInvalidUtf8(get)}, {"name", "UTF-8"}},
      {"DeleteTensor name", "DeleteTensor", {WithInvalidUtf8(del)}, {"name", "UTF-8"}},
      {"PutTensor header name", "PutTensor", {WithInvalidUtf8(header), chunk.SerializeAsString()},
       {"header.name", "UTF-8", "message 1"}},
      {"Execute node id", "Execute", {bad_node_id}, {"nodes[1].id", "UTF-8"}},
      {"Execute store_as", "Execute", {bad_store_as}, {"outputs[0].store_as", "UTF-8"}},
      {"Execute inline tensor name", "Execute", {bad_inline_key},
       {"inline_tensors", "key", "UTF-8"}},
      {"Execute attribute string", "Execute", {bad_attr_string},
       {"nodes[0].attrs", "value.s", "UTF-8"}},
  });
}

TEST_F(MalformedRequestsTest, WireDataCutShortOnEveryRpc) {
  std::vector<Case> cases;
  for (const char* method :
       {"GetTensor", "DeleteTensor", "PutTensor", "Execute", "ListTensors", "ListOps"}) {
    cases.push_back({method, method, {kTruncated}, {"does not parse", "number 1", "cut short"}});
  }
  RunAll(cases);
}

// A PutTensor whose header and bytes were complete but whose last message does not parse: the
// upload is refused, not committed as if the client had half-closed.
TEST_F(MalformedRequestsTest, AnUnparsableMessageAfterTheBytesIsNotAnEndOfStream) {
  v1::PutTensorRequest header;
  header.mutable_header()->set_name("p");
  header.mutable_header()->set_dtype(v1::FLOAT32);
  header.mutable_header()->add_shape(2);
  v1::PutTensorRequest chunk;
  chunk.set_chunk(std::string(8, '\0'));
  RunAll({{"truncated third message",
           "PutTensor",
           {header.SerializeAsString(), chunk.SerializeAsString(), kTruncated},
           {"message 3", "does not parse"}}});
  EXPECT_EQ(client().ListTensors()->size(), 1u);
}

// The raw path is the real one: well-formed bytes sent the same way work.
TEST_F(MalformedRequestsTest, WellFormedRawRequestsStillWork) {
  v1::GetTensorRequest get;
  get.set_name("A");
  RawResult r = RawCall(server().target(), "GetTensor", {get.SerializeAsString()});
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.responses, 2);  // the info, and one chunk of 24 bytes
  r = RawCall(server().target(), "ListOps", {""});
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.responses, 1);
}

}  // namespace
}  // namespace opserve::e2e
