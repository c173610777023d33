// Execute-request builders and the status matcher their answers are checked with, shared by the
// unit tests that call BuildPlan directly and by every suite that drives a server (through
// tests/e2e/e2e_fixture.h, which re-exports them into opserve::e2e).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/host_tensor.h"
#include "opserve/v1/opserve.pb.h"

namespace opserve::test_support {

// The code, and every fragment somewhere in the message.
::testing::AssertionResult StatusIs(const absl::Status& s, absl::StatusCode code,
                                    std::initializer_list<std::string> fragments = {});

// One input of a node. kNone gives the input no source at all, for malformed requests.
struct In {
  enum Kind { kStored, kInline, kNode, kNone } kind;
  std::string name;
};
inline In Stored(std::string n) { return {In::kStored, std::move(n)}; }
inline In Inline(std::string n) { return {In::kInline, std::move(n)}; }
inline In Node(std::string n) { return {In::kNode, std::move(n)}; }

v1::Node* AddNode(v1::ExecuteRequest& r, const std::string& id, const std::string& op,
                  const std::vector<In>& inputs, const std::string& algorithm = "");
// An inline tensor of zeros with the right byte count (none for a dtype without a size), or with
// `bytes` when given.
void AddInline(v1::ExecuteRequest& r, const std::string& name, v1::DType dtype,
               const std::vector<int64_t>& shape, int64_t bytes = -1);
void AddInline(v1::ExecuteRequest& r, const std::string& name, const client::HostTensor& t);
void AddOutput(v1::ExecuteRequest& r, const std::string& node, bool return_inline,
               const std::string& store_as = "", bool overwrite = false);

}  // namespace opserve::test_support
