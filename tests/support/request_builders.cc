#include "tests/support/request_builders.h"

#include <cstdint>

#include "absl/strings/string_view.h"

namespace opserve::test_support {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

AssertionResult StatusIs(const absl::Status& s, absl::StatusCode code,
                         std::initializer_list<std::string> fragments) {
  if (s.code() != code) {
    return AssertionFailure() << "code " << absl::StatusCodeToString(s.code()) << ", expected "
                              << absl::StatusCodeToString(code) << " (message: " << s.message()
                              << ")";
  }
  for (const std::string& f : fragments) {
    if (s.message().find(f) == absl::string_view::npos) {
      return AssertionFailure() << absl::StatusCodeToString(code) << " as expected, but \""
                                << s.message() << "\" does not mention \"" << f << "\"";
    }
  }
  return AssertionSuccess();
}

v1::Node* AddNode(v1::ExecuteRequest& r, const std::string& id, const std::string& op,
                  const std::vector<In>& inputs, const std::string& algorithm) {
  v1::Node* n = r.add_nodes();
  n->set_id(id);
  n->set_op(op);
  n->set_algorithm(algorithm);
  for (const In& in : inputs) {
    v1::Input* i = n->add_inputs();
    switch (in.kind) {
      case In::kStored:
        i->set_stored(in.name);
        break;
      case In::kInline:
        i->set_inline_name(in.name);
        break;
      case In::kNode:
        i->set_node(in.name);
        break;
      case In::kNone:
        break;  // no source at all
    }
  }
  return n;
}

void AddInline(v1::ExecuteRequest& r, const std::string& name, v1::DType dtype,
               const std::vector<int64_t>& shape, int64_t bytes) {
  v1::Tensor& t = (*r.mutable_inline_tensors())[name];
  t.set_dtype(dtype);
  t.mutable_shape()->Add(shape.begin(), shape.end());
  const uint64_t want = client::ByteSize(dtype, shape).value_or(0);
  t.set_data(std::string(bytes >= 0 ? static_cast<uint64_t>(bytes) : want, '\0'));
}

void AddInline(v1::ExecuteRequest& r, const std::string& name, const client::HostTensor& t) {
  (*r.mutable_inline_tensors())[name] = client::ToProto(t);
}

void AddOutput(v1::ExecuteRequest& r, const std::string& node, bool return_inline,
               const std::string& store_as, bool overwrite) {
  v1::OutputSpec* o = r.add_outputs();
  o->set_node(node);
  o->set_return_inline(return_inline);
  o->set_store_as(store_as);
  o->set_overwrite(overwrite);
}

}  // namespace opserve::test_support
