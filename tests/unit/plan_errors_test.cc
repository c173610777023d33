// Every error class of the Execute contract, through BuildPlan with a real
// TensorStore and the CPU backend. Each test asserts the code and that the message names the
// culprit (node id, tensor name) and what was expected against what was received.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/engine/cpu_backend.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/plan.h"
#include "server/ops/op.h"
#include "server/rpc/convert.h"
#include "tests/support/request_builders.h"

namespace opserve {
namespace {

using test_support::AddInline;
using test_support::AddNode;
using test_support::AddOutput;
using test_support::In;
using test_support::Inline;
using test_support::Node;
using test_support::StatusIs;
using test_support::Stored;

class PlanErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Stored: A FLOAT32[2,3], B FLOAT32[3,4], I INT32[2,3].
    Put("A", {DType::kFloat32, {2, 3}});
    Put("B", {DType::kFloat32, {3, 4}});
    Put("I", {DType::kInt32, {2, 3}});
    limits_.max_tensor_bytes = 1 << 20;
    limits_.max_graph_nodes = 8;
    limits_.max_message_bytes = 1 << 16;
  }

  void Put(const std::string& name, TensorMeta meta) {
    auto buffer = backend_->Allocate(meta.Bytes());
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    auto t = std::make_shared<StoredTensor>(StoredTensor{name, std::move(meta), *buffer});
    ASSERT_TRUE(store_.InsertAll({t}, {false}).ok());
  }

  absl::StatusOr<Plan> Build() {
    return BuildPlan(convert::GraphFromProto(req_), *backend_, store_, limits_);
  }
  absl::Status BuildStatus() { return Build().status(); }

  std::unique_ptr<Backend> backend_ = MakeCpuBackend(64 << 20);
  TensorStore store_;
  Limits limits_;
  v1::ExecuteRequest req_;
};

// ---- The valid path, so the errors below are known to come from what each test breaks. ----

TEST_F(PlanErrorsTest, ValidThreeNodeGraphPlansInTopologicalOrder) {
  AddInline(req_, "b", v1::FLOAT32, {3, 5});
  // Listed consumers first: the plan must reorder them.
  AddNode(req_, "mean", "row_mean", {Node("t")});
  // Unfused (fuse=false), so that every node plans as sent (fusion: fusion_test.cc).
  (*AddNode(req_, "t", "transpose", {Node("mm")})->mutable_attrs())["fuse"].set_b(false);
  AddNode(req_, "mm", "matmul", {Stored("A"), Inline("b")}, "auto");
  AddOutput(req_, "mean", /*return_inline=*/true);
  AddOutput(req_, "mm", /*return_inline=*/false, "C");
  absl::StatusOr<Plan> plan = Build();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes.size(), 3u);
  EXPECT_EQ(plan->nodes[0].id, "mm");
  EXPECT_EQ(plan->nodes[1].id, "t");
  EXPECT_EQ(plan->nodes[2].id, "mean");
  EXPECT_EQ(plan->nodes[0].output, (TensorMeta{DType::kFloat32, {2, 5}}));
  EXPECT_EQ(plan->nodes[1].output, (TensorMeta{DType::kFloat32, {5, 2}}));
  EXPECT_EQ(plan->nodes[2].output, (TensorMeta{DType::kFloat32, {5}}));
  for (const PlanNode& n : plan->nodes) EXPECT_EQ(n.algo->name, "reference") << n.id;
  EXPECT_EQ(plan->nodes[0].last_use, 1);
  EXPECT_EQ(plan->nodes[1].last_use, 2);
  EXPECT_TRUE(plan->nodes[2].returned);
  ASSERT_EQ(plan->nodes[0].store_as.size(), 1u);
  EXPECT_EQ(plan->nodes[0].store_as[0].name, "C");
  EXPECT_EQ(plan->nodes[0].cost.flops, 2u * 2 * 3 * 5);
  EXPECT_EQ(plan->nodes[0].cost.bytes, (2u * 3 + 3 * 5 + 2 * 5) * 4);
}

TEST_F(PlanErrorsTest, EmptyAndAutoAlgorithmsChooseTheDefault) {
  AddNode(req_, "s1", "sum", {Stored("A")}, "");
  AddNode(req_, "s2", "sum", {Stored("I")}, "auto");
  AddNode(req_, "s3", "sum", {Stored("A")}, "reference");
  AddOutput(req_, "s2", true);
  absl::StatusOr<Plan> plan = Build();
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlanNode& n : plan->nodes) EXPECT_EQ(n.algo->name, "reference") << n.id;
}

// ---- INVALID_ARGUMENT ----

TEST_F(PlanErrorsTest, EmptyGraph) {
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"no nodes"}));
}

TEST_F(PlanErrorsTest, EmptyGraphWithOnlyInlineTensors) {
  AddInline(req_, "x", v1::FLOAT32, {2});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"no nodes"}));
}

TEST_F(PlanErrorsTest, UnknownOp) {
  AddNode(req_, "n1", "softmax", {Stored("A")});
  // Names the node and the op, and lists the ops there are: every op of the table.
  const absl::Status status = BuildStatus();
  EXPECT_TRUE(StatusIs(status, absl::StatusCode::kInvalidArgument, {"'n1'", "'softmax'"}));
  for (const OpSpec& op : Ops()) {
    EXPECT_TRUE(absl::StrContains(status.message(), op.name)) << op.name << ": " << status;
  }
}

TEST_F(PlanErrorsTest, UnknownAttribute) {
  v1::Node* n = AddNode(req_, "n1", "sum", {Stored("A")});
  (*n->mutable_attrs())["axis"].set_i(0);
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'n1'", "'axis'", "accepts fuse"}));
}

TEST_F(PlanErrorsTest, WrongArityTooFew) {
  AddNode(req_, "mm", "matmul", {Stored("A")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'mm'", "matmul", "expected 2", "got 1"}));
}

TEST_F(PlanErrorsTest, WrongArityTooMany) {
  AddNode(req_, "s", "sum", {Stored("A"), Stored("B")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'s'", "sum", "expected 1", "got 2"}));
}

TEST_F(PlanErrorsTest, WrongArityNone) {
  AddNode(req_, "t", "transpose", {});
  EXPECT_TRUE(
      StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'t'", "expected 1", "got 0"}));
}

TEST_F(PlanErrorsTest, InputWithNoSource) {
  AddNode(req_, "s", "sum", {In{In::kNone, ""}});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'s'", "input 0"}));
}

// The reductions take every dtype; a rank they do not take names the input and its shape.
TEST_F(PlanErrorsTest, RowSumOfARank1Tensor) {
  AddInline(req_, "x", v1::INT64, {4});
  AddNode(req_, "rs", "row_sum", {Inline("x")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'rs'", "rank 2", "INT64[4]"}));
}

// Integer row sums are exact: INT64 out.
TEST_F(PlanErrorsTest, CpuRowSumOfInt32RunsAndIsInt64) {
  AddNode(req_, "rs", "row_sum", {Stored("I")});
  absl::StatusOr<Plan> plan = Build();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->nodes[0].output.DebugString(), "INT64[2]");
}

TEST_F(PlanErrorsTest, DtypeMismatchMatmulOperands) {
  AddInline(req_, "b", v1::BFLOAT16, {3, 4});
  AddNode(req_, "mm", "matmul", {Stored("A"), Inline("b")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'mm'", "FLOAT32", "BFLOAT16[3,4]"}));
}

TEST_F(PlanErrorsTest, DtypeMismatchMatmulOfInt32) {
  AddNode(req_, "mm", "matmul", {Stored("I"), Stored("I")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'mm'", "FLOAT32 or BFLOAT16", "INT32[2,3]"}));
}

TEST_F(PlanErrorsTest, ShapeMismatchMatmulInnerDimensions) {
  AddInline(req_, "b", v1::FLOAT32, {4, 5});
  AddNode(req_, "mm", "matmul", {Stored("A"), Inline("b")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'mm'", "FLOAT32[2,3]", "FLOAT32[4,5]", "= 3"}));
}

TEST_F(PlanErrorsTest, ShapeMismatchRowMeanOfRank1) {
  AddInline(req_, "v", v1::FLOAT32, {5});
  AddNode(req_, "rm", "row_mean", {Inline("v")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'rm'", "rank 2", "FLOAT32[5]"}));
}

TEST_F(PlanErrorsTest, ShapeMismatchTransposeOfRank3) {
  AddInline(req_, "v", v1::INT32, {2, 3, 4});
  AddNode(req_, "t", "transpose", {Inline("v")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'t'", "rank 2", "INT32[2,3,4]"}));
}

TEST_F(PlanErrorsTest, ShapeMismatchThroughAnIntermediate) {
  // sum gives a scalar; transpose of it is a shape error at the second node.
  AddNode(req_, "s", "sum", {Stored("A")});
  AddNode(req_, "t", "transpose", {Node("s")});
  EXPECT_TRUE(
      StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'t'", "rank 2", "FLOAT32[]"}));
}

TEST_F(PlanErrorsTest, InlineByteCountTooFew) {
  AddInline(req_, "x", v1::FLOAT32, {2, 2}, /*bytes=*/15);
  AddNode(req_, "s", "sum", {Inline("x")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'x'", "15 bytes", "expected 16", "FLOAT32[2,2]"}));
}

TEST_F(PlanErrorsTest, InlineByteCountTooMany) {
  AddInline(req_, "x", v1::FLOAT32, {2, 2}, /*bytes=*/17);
  AddNode(req_, "s", "sum", {Inline("x")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'x'", "17 bytes", "expected 16"}));
}

TEST_F(PlanErrorsTest, InlineByteCountOfAnUnreadTensorStillChecked) {
  AddInline(req_, "unused", v1::INT64, {3}, /*bytes=*/8);
  AddNode(req_, "s", "sum", {Stored("A")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'unused'", "8 bytes", "expected 24"}));
}

TEST_F(PlanErrorsTest, InlineTensorBadMeta) {
  AddInline(req_, "r5", v1::FLOAT32, {1, 1, 1, 1, 1});
  AddNode(req_, "s", "sum", {Inline("r5")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'r5'", "rank", "5"}));
}

TEST_F(PlanErrorsTest, InlineTensorBadDtype) {
  AddInline(req_, "u", v1::DTYPE_UNSPECIFIED, {2});
  AddNode(req_, "s", "sum", {Inline("u")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'u'", "dtype", "got DTYPE_UNSPECIFIED (0)"}));
}

// A dtype value the enum does not have is named by its number, not as DTYPE_UNSPECIFIED.
TEST_F(PlanErrorsTest, InlineTensorDtypeOutsideTheEnum) {
  v1::Tensor& t = (*req_.mutable_inline_tensors())["u"];
  t.set_dtype(static_cast<v1::DType>(99));
  t.add_shape(2);
  t.set_data(std::string(8, '\0'));
  AddNode(req_, "s", "sum", {Inline("u")});
  const absl::Status s = BuildStatus();
  EXPECT_TRUE(StatusIs(s, absl::StatusCode::kInvalidArgument, {"'u'", "dtype", "got 99"}));
  EXPECT_EQ(s.message().find("DTYPE_UNSPECIFIED"), absl::string_view::npos) << s;
}

TEST_F(PlanErrorsTest, InlineTensorBadName) {
  AddInline(req_, "has space", v1::FLOAT32, {2});
  AddNode(req_, "s", "sum", {Inline("has space")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"has space"}));
}

TEST_F(PlanErrorsTest, DuplicateNodeId) {
  AddNode(req_, "n", "sum", {Stored("A")});
  AddNode(req_, "n", "sum", {Stored("B")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"duplicate", "'n'"}));
}

TEST_F(PlanErrorsTest, EmptyNodeId) {
  AddNode(req_, "", "sum", {Stored("A")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"empty id"}));
}

TEST_F(PlanErrorsTest, Cycle) {
  AddNode(req_, "a", "transpose", {Node("b")});
  AddNode(req_, "b", "transpose", {Node("a")});
  AddNode(req_, "ok", "sum", {Stored("A")});
  absl::Status s = BuildStatus();
  EXPECT_TRUE(StatusIs(s, absl::StatusCode::kInvalidArgument, {"cycle", "'a'", "'b'"}));
  EXPECT_EQ(s.message().find("'ok'"), absl::string_view::npos) << s.message();
}

TEST_F(PlanErrorsTest, LongerCycle) {
  AddNode(req_, "t0", "transpose", {Stored("A")});
  AddNode(req_, "a", "matmul", {Node("t0"), Node("c")});
  AddNode(req_, "b", "transpose", {Node("a")});
  AddNode(req_, "c", "transpose", {Node("b")});
  EXPECT_TRUE(
      StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"cycle", "'a'", "'b'", "'c'"}));
}

TEST_F(PlanErrorsTest, SelfLoop) {
  AddNode(req_, "a", "transpose", {Node("a")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"cycle", "'a'"}));
}

TEST_F(PlanErrorsTest, DanglingNodeReference) {
  AddNode(req_, "t", "transpose", {Node("ghost")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'t'", "'ghost'", "not in the graph"}));
}

TEST_F(PlanErrorsTest, DanglingInlineReference) {
  AddInline(req_, "x", v1::FLOAT32, {2, 2});
  AddNode(req_, "t", "transpose", {Inline("nope")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'t'", "'nope'", "not in the request"}));
}

TEST_F(PlanErrorsTest, DanglingOutputReference) {
  AddNode(req_, "s", "sum", {Stored("A")});
  AddOutput(req_, "ghost", true);
  EXPECT_TRUE(
      StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'ghost'", "not in the graph"}));
}

TEST_F(PlanErrorsTest, OutputThatGoesNowhere) {
  AddNode(req_, "s", "sum", {Stored("A")});
  AddOutput(req_, "s", /*return_inline=*/false);
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'s'"}));
}

TEST_F(PlanErrorsTest, TwoOutputsStoreUnderOneName) {
  AddNode(req_, "s1", "sum", {Stored("A")});
  AddNode(req_, "s2", "sum", {Stored("B")});
  AddOutput(req_, "s1", false, "total");
  AddOutput(req_, "s2", false, "total");
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'total'"}));
}

TEST_F(PlanErrorsTest, StoreAsBadName) {
  AddNode(req_, "s", "sum", {Stored("A")});
  AddOutput(req_, "s", false, "bad name!");
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument, {"'s'", "bad name!"}));
}

// ---- NOT_FOUND ----

TEST_F(PlanErrorsTest, MissingStoredTensor) {
  AddNode(req_, "s", "sum", {Stored("missing")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kNotFound, {"'s'", "'missing'"}));
}

TEST_F(PlanErrorsTest, MissingStoredTensorAsSecondInput) {
  AddNode(req_, "mm", "matmul", {Stored("A"), Stored("gone")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kNotFound, {"'mm'", "input 1", "'gone'"}));
}

// ---- ALREADY_EXISTS ----

TEST_F(PlanErrorsTest, StoreAsExistingName) {
  AddNode(req_, "t", "transpose", {Stored("A")});
  AddOutput(req_, "t", false, "B");
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kAlreadyExists, {"'B'", "overwrite"}));
}

TEST_F(PlanErrorsTest, StoreAsExistingNameWithOverwrite) {
  AddNode(req_, "t", "transpose", {Stored("A")});
  AddOutput(req_, "t", false, "B", /*overwrite=*/true);
  // Even over an input of the same request: the plan holds the old tensor.
  AddOutput(req_, "t", true, "A", /*overwrite=*/true);
  absl::StatusOr<Plan> plan = Build();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes[0].store_as.size(), 2u);
  EXPECT_EQ(plan->nodes[0].store_as[0].name, "B");
  EXPECT_TRUE(plan->nodes[0].store_as[0].overwrite);
  EXPECT_EQ(plan->nodes[0].inputs[0].stored->name, "A");
}

// ---- RESOURCE_EXHAUSTED ----

TEST_F(PlanErrorsTest, GraphOverMaxNodes) {
  limits_.max_graph_nodes = 4;
  for (int i = 0; i < 5; ++i) AddNode(req_, absl::StrCat("s", i), "sum", {Stored("A")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kResourceExhausted,
                       {"5 nodes", "limit of 4", "max_graph_nodes"}));
}

TEST_F(PlanErrorsTest, GraphAtMaxNodesIsFine) {
  limits_.max_graph_nodes = 4;
  for (int i = 0; i < 4; ++i) AddNode(req_, absl::StrCat("s", i), "sum", {Stored("A")});
  EXPECT_TRUE(Build().ok());
}

TEST_F(PlanErrorsTest, InlineTensorOverMaxTensorBytes) {
  limits_.max_tensor_bytes = 1024;
  AddInline(req_, "big", v1::FLOAT32, {257});
  AddNode(req_, "s", "sum", {Inline("big")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kResourceExhausted,
                       {"'big'", "1028 bytes", "limit of 1024"}));
}

TEST_F(PlanErrorsTest, IntermediateOverMaxTensorBytes) {
  // [512,1] x [1,512] is 2 KiB in and 1 MiB out.
  limits_.max_tensor_bytes = 64 << 10;
  AddInline(req_, "col", v1::FLOAT32, {512, 1});
  AddInline(req_, "row", v1::FLOAT32, {1, 512});
  AddNode(req_, "outer", "matmul", {Inline("col"), Inline("row")});
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kResourceExhausted,
                       {"'outer'", "FLOAT32[512,512]", "1048576 bytes", "limit of 65536"}));
}

// The output's byte count is computed with an overflow check: [2^31, 1] x [1, 2^31] is 2^64
// bytes of FLOAT32, which wraps to 0 in plain 64-bit arithmetic. (The stored inputs only claim
// their shapes: planning never touches their bytes.)
TEST_F(PlanErrorsTest, IntermediateWhoseBytesOverflow) {
  limits_.max_tensor_bytes = std::numeric_limits<uint64_t>::max();
  for (const auto& [name, shape] :
       {std::pair<std::string, std::vector<int64_t>>{"col", {int64_t{1} << 31, 1}},
        {"row", {1, int64_t{1} << 31}}}) {
    auto t = std::make_shared<StoredTensor>(StoredTensor{name, {DType::kFloat32, shape}, nullptr});
    ASSERT_TRUE(store_.InsertAll({t}, {false}).ok());
  }
  AddNode(req_, "outer", "matmul", {Stored("col"), Stored("row")});
  absl::Status s = BuildStatus();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kResourceExhausted ||
              s.code() == absl::StatusCode::kInvalidArgument)
      << s;
  EXPECT_NE(s.message().find("'outer'"), absl::string_view::npos) << s;
}

TEST_F(PlanErrorsTest, ReturnedOutputsOverMaxMessageBytes) {
  limits_.max_message_bytes = 4096;
  AddInline(req_, "x", v1::FLOAT32, {32, 32});  // 4096 bytes
  AddNode(req_, "t", "transpose", {Inline("x")});
  AddNode(req_, "s", "sum", {Inline("x")});
  AddOutput(req_, "t", true);
  AddOutput(req_, "s", true);
  // 4096 + 4 bytes returned. The message must name what is returned, per item 5.
  EXPECT_TRUE(
      StatusIs(BuildStatus(), absl::StatusCode::kResourceExhausted, {"4100 bytes", "4096", "'t'"}));
}

// The limit covers the whole response: the tensors plus their framing.
TEST_F(PlanErrorsTest, ReturnedOutputsAtMaxMessageBytesIsFine) {
  limits_.max_message_bytes = 4096 + ResponseOverheadBytes(/*num_nodes=*/1, /*num_returned=*/1);
  AddInline(req_, "x", v1::FLOAT32, {32, 32});
  AddNode(req_, "t", "transpose", {Inline("x")});
  AddOutput(req_, "t", true);
  AddOutput(req_, "t", true);  // the same node twice is returned once
  EXPECT_TRUE(Build().ok());
}

// A name no row of the op has anywhere is the request's mistake: INVALID_ARGUMENT.
TEST_F(PlanErrorsTest, UnknownAlgorithmListsTheBackendsAlgorithms) {
  AddNode(req_, "mm", "matmul", {Stored("A"), Stored("B")}, "warp9");
  EXPECT_TRUE(StatusIs(BuildStatus(), absl::StatusCode::kInvalidArgument,
                       {"'mm'", "'warp9'", "has no algorithm", "reference"}));
}

// ---- UNIMPLEMENTED ----

// Another backend's row is this server's limit, UNIMPLEMENTED; in a build without CUDA the
// table has no such row, and the name is unknown like any other.
TEST_F(PlanErrorsTest, CudaOnlyAlgorithmOnTheCpuBackend) {
  AddNode(req_, "s", "sum", {Stored("A")}, "cub");
  bool cuda_rows = false;
  for (const AlgoSpec& row : Algorithms()) cuda_rows |= row.backend == "cuda";
  EXPECT_TRUE(StatusIs(BuildStatus(),
                       cuda_rows ? absl::StatusCode::kUnimplemented
                                 : absl::StatusCode::kInvalidArgument,
                       {"'s'", "'cub'", "reference"}));
}

// A failed plan touches nothing: the store is as it was.
TEST_F(PlanErrorsTest, FailedPlanLeavesTheStoreAlone) {
  AddNode(req_, "t", "transpose", {Stored("A")});
  AddNode(req_, "bad", "matmul", {Stored("A"), Stored("A")});
  AddOutput(req_, "t", false, "new_name");
  ASSERT_FALSE(Build().ok());
  EXPECT_EQ(store_.size(), 3u);
  EXPECT_FALSE(store_.Get("new_name").ok());
}

}  // namespace
}  // namespace opserve
