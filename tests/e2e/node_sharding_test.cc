// Sharded tensors (PutTensorHeader.shard): rank-2 tensors split by rows over every device, read
// back whole, reduced per shard (row_* ops give sharded outputs; sum, max and min combine the
// shards' partial results), multiplied (matmul(A sharded, B) broadcasts B and gives C sharded),
// and gathered onto one device for everything else (transpose, MoveTensor). Every result is
// checked against the op table's CPU reference on fresh random data.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/e2e/node_fixture.h"

namespace opserve::e2e {
namespace {

using Code = absl::StatusCode;

constexpr v1::DType kDTypes[] = {v1::FLOAT32, v1::INT32, v1::BFLOAT16};

class NodeShardingTest : public NodeTest {
 protected:
  // Row counts at the edges of the split: one row, fewer rows than devices, a multiple of the
  // device count, one past it, and more that no device count here divides.
  std::vector<int64_t> EdgeRows() const {
    const std::set<int64_t> rows = {
        1, n() - 1, static_cast<int64_t>(n()), n() + 1L, 2L * n() + 1, 4L * n(), 101};
    return {rows.begin(), rows.end()};
  }

  // The devices a sharded tensor of `rows` rows lives on, joined as the server reports them.
  std::string ShardDevices(int64_t rows) const {
    std::vector<std::string> names;
    for (const ShardSpan& s : ExpectedShards(rows, n())) names.push_back(dev(s.device));
    return Joined(names);
  }

  // Puts `t` sharded as `name` and checks the parts the server reports.
  void PutSharded(const std::string& name, const client::HostTensor& t) {
    absl::StatusOr<v1::TensorInfo> info = node().Put(name, t, {.shard = true, .overwrite = true});
    ASSERT_TRUE(info.ok()) << name << ": " << info.status();
    ASSERT_TRUE(ShardedAs(*info, t.shape[0], Bytes(t) / t.shape[0], devices()));
  }
};

TEST_P(NodeShardingTest, PutShardedAndGetItBackWhole) {
  for (v1::DType dtype : kDTypes) {
    for (int64_t rows : EdgeRows()) {
      for (int64_t cols : {5, 33}) {
        SCOPED_TRACE(absl::StrCat(client::DTypeName(dtype), "[", rows, ", ", cols, "]"));
        const client::HostTensor t = RandomValues(dtype, {rows, cols}, rng_);
        ASSERT_NO_FATAL_FAILURE(PutSharded("s", t));
        absl::StatusOr<GotTensor> got = node().Get("s");
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->tensor.shape, t.shape);
        EXPECT_EQ(got->tensor.dtype, dtype);
        EXPECT_TRUE(got->tensor.data == t.data) << "the shards, put together, differ";
        EXPECT_TRUE(ShardedAs(got->info, rows, Bytes(t) / rows, devices())) << "GetTensor's info";
        absl::StatusOr<v1::TensorInfo> listed = node().Listed("s");
        ASSERT_TRUE(listed.ok()) << listed.status();
        EXPECT_TRUE(ShardedAs(*listed, rows, Bytes(t) / rows, devices())) << "ListTensors";
      }
    }
  }
}

TEST_P(NodeShardingTest, EachShardIsChargedToItsDevice) {
  const int64_t rows = 2L * n() + 1, cols = 1024;
  std::vector<uint64_t> before;
  for (const std::string& d : devices()) before.push_back(DeviceEntry(d).memory_used());
  const client::HostTensor t = RandomValues(v1::FLOAT32, {rows, cols}, rng_);
  ASSERT_NO_FATAL_FAILURE(PutSharded("s", t));
  for (const ShardSpan& s : ExpectedShards(rows, n())) {
    EXPECT_GE(DeviceEntry(dev(s.device)).memory_used(),
              before[s.device] + static_cast<uint64_t>(s.rows * cols * 4))
        << dev(s.device) << " holds rows " << s.row_begin << "+" << s.rows;
  }
  ASSERT_TRUE(node().Delete("s").ok());
  EXPECT_TRUE(StatusIs(node().Get("s").status(), Code::kNotFound, {"'s'"}));
  for (int d = 0; d < n(); ++d) {
    EXPECT_EQ(DeviceEntry(dev(d)).memory_used(), before[d]) << dev(d) << " after the delete";
  }
}

// row_sum, row_mean, row_max and row_min run per shard on the shard's device; the output comes
// back whole.
TEST_P(NodeShardingTest, RowReductionsRunOnEveryShard) {
  for (v1::DType dtype : kDTypes) {
    for (int64_t rows : {static_cast<int64_t>(n() - 1), 2L * n() + 1, 101L}) {
      SCOPED_TRACE(absl::StrCat(client::DTypeName(dtype), "[", rows, ", 37]"));
      const client::HostTensor t = RandomValues(dtype, {rows, 37}, rng_);
      ASSERT_NO_FATAL_FAILURE(PutSharded("s", t));
      for (const char* op : {"row_sum", "row_mean", "row_max", "row_min"}) {
        SCOPED_TRACE(op);
        absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode(op, {Stored("s")}));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->device(), ShardDevices(rows)) << "a shard's rows run on its device";
        EXPECT_EQ(r->peer_copy_bytes(), 0u) << "no shard moves";
        EXPECT_TRUE(MatchesReference(op, {t}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
      }
    }
  }
}

TEST_P(NodeShardingTest, StoredRowSumOfAShardedInputIsSharded) {
  for (v1::DType dtype : kDTypes) {
    SCOPED_TRACE(client::DTypeName(dtype));
    const int64_t rows = 3L * n() + 1;
    const client::HostTensor t = RandomValues(dtype, {rows, 29}, rng_);
    ASSERT_NO_FATAL_FAILURE(PutSharded("s", t));
    v1::ExecuteRequest req = OneNode("row_sum", {Stored("s")}, "sums");
    req.mutable_outputs(0)->set_overwrite(true);
    absl::StatusOr<v1::ExecuteResponse> r = node().Execute(req);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->stored_size(), 1);
    // row_sum of INT32 is INT64; of the floats, FLOAT32.
    const uint64_t out_size = dtype == v1::INT32 ? 8 : 4;
    EXPECT_TRUE(ShardedAs(r->stored(0), rows, out_size, devices())) << "Execute's stored info";
    absl::StatusOr<GotTensor> got = node().Get("sums");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(ShardedAs(got->info, rows, out_size, devices())) << "GetTensor's info";
    EXPECT_TRUE(got->tensor.data == Output(*r, "n").data()) << "stored and returned differ";
    EXPECT_TRUE(MatchesReference("row_sum", {t}, got->tensor, NodeReport(*r, "n").algorithm()));
    // The sharded output is an input like any other: its sum combines its shards.
    absl::StatusOr<v1::ExecuteResponse> total = node().Execute(OneNode("sum", {Stored("sums")}));
    ASSERT_TRUE(total.ok()) << total.status();
    EXPECT_EQ(total->device(), ShardDevices(rows));
    EXPECT_TRUE(MatchesReference("sum", {got->tensor}, Output(*total, "n"),
                                 NodeReport(*total, "n").algorithm()));
  }
}

// sum, max and min of a sharded tensor: each shard's partial result, then those combined. INT32
// sums exactly (in INT64), max and min bit for bit, FLOAT32 sums within the op's tolerance.
TEST_P(NodeShardingTest, WholeReductionsCombineTheShards) {
  for (v1::DType dtype : kDTypes) {
    for (int64_t rows : {static_cast<int64_t>(n() - 1), 2L * n() + 1, 257L}) {
      SCOPED_TRACE(absl::StrCat(client::DTypeName(dtype), "[", rows, ", 41]"));
      const client::HostTensor t = RandomValues(dtype, {rows, 41}, rng_);
      ASSERT_NO_FATAL_FAILURE(PutSharded("s", t));
      for (const char* op : {"sum", "max", "min"}) {
        SCOPED_TRACE(op);
        absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode(op, {Stored("s")}));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->device(), ShardDevices(rows));
        EXPECT_TRUE(MatchesReference(op, {t}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
      }
    }
  }
}

// Partial results that only a wide combine holds, and the extremes' edge values split over
// shards: each shard's INT32 sum overflows 32 bits; a NaN in the last shard only (max and min
// give the canonical NaN, bit for bit); -0.0 and +0.0 in different shards, either way round
// (-0.0 orders below +0.0: max is +0.0, min -0.0, whichever shard holds which).
TEST_P(NodeShardingTest, CombiningKeepsOverflowNaNAndSignedZeros) {
  const int64_t rows = 2L * n() + 1, cols = 64;
  const std::vector<ShardSpan> spans = ExpectedShards(rows, n());
  client::HostTensor big{v1::INT32, {rows, cols}, std::string(rows * cols * 4, '\0')};
  for (int64_t i = 0; i < rows * cols; ++i) {
    reinterpret_cast<int32_t*>(big.data.data())[i] = std::numeric_limits<int32_t>::max() - i;
  }
  ASSERT_NO_FATAL_FAILURE(PutSharded("big", big));
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("sum", {Stored("big")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(MatchesReference("sum", {big}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));

  // Element `i` of a FLOAT32 or BFLOAT16 tensor set to `f`.
  auto set = [](client::HostTensor& t, int64_t i, float f) {
    if (t.dtype == v1::FLOAT32) {
      reinterpret_cast<float*>(t.data.data())[i] = f;
    } else {
      reinterpret_cast<uint16_t*>(t.data.data())[i] = std::bit_cast<uint32_t>(f) >> 16;
    }
  };
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    SCOPED_TRACE(client::DTypeName(dtype));
    client::HostTensor nan = RandomValues(dtype, {rows, cols}, rng_);
    set(nan, spans.back().row_begin * cols + 3, std::numeric_limits<float>::quiet_NaN());
    ASSERT_NO_FATAL_FAILURE(PutSharded("nan", nan));
    for (const char* op : {"max", "min"}) {
      r = node().Execute(OneNode(op, {Stored("nan")}));
      ASSERT_TRUE(r.ok()) << op << ": " << r.status();
      EXPECT_TRUE(MatchesReference(op, {nan}, Output(*r, "n"), NodeReport(*r, "n").algorithm()))
          << op << " of a tensor with a NaN in its last shard";
    }
    r = node().Execute(OneNode("sum", {Stored("nan")}));
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<float> sum = Floats(Output(*r, "n").data());
    ASSERT_EQ(sum.size(), 1u);
    EXPECT_TRUE(std::isnan(sum[0])) << "sum of a tensor with a NaN in its last shard: " << sum[0];

    for (bool negative_first : {true, false}) {
      SCOPED_TRACE(negative_first ? "-0.0 in the first shard" : "-0.0 in the last shard");
      client::HostTensor zeros = RandomValues(dtype, {rows, cols}, rng_);
      const ShardSpan& negative = negative_first ? spans.front() : spans.back();
      for (int64_t i = 0; i < rows * cols; ++i) {
        const bool in_negative =
            i >= negative.row_begin * cols && i < (negative.row_begin + negative.rows) * cols;
        set(zeros, i, in_negative ? -0.f : 0.f);
      }
      ASSERT_NO_FATAL_FAILURE(PutSharded("zeros", zeros));
      for (const char* op : {"max", "min"}) {
        r = node().Execute(OneNode(op, {Stored("zeros")}));
        ASSERT_TRUE(r.ok()) << op << ": " << r.status();
        EXPECT_TRUE(MatchesReference(op, {zeros}, Output(*r, "n"), NodeReport(*r, "n").algorithm()))
            << op << " over -0.0 and +0.0 in different shards: "
            << (std::string(op) == "max" ? "+0.0" : "-0.0") << " expected";
      }
    }
  }
}

// matmul(A sharded, B on device 0): B is copied to every other shard's device, each computes its
// rows of C, and C stored is sharded as A is. On GPUs B arrives in chunks of its rows and
// cuBLAS (auto) multiplies slice by slice as they land; a named kernel waits for all of B.
TEST_P(NodeShardingTest, MatmulOfAShardedAIsShardedByRows) {
  std::vector<std::string> algorithms = {"auto"};
  if (IsCuda()) algorithms.push_back("tiled");
  for (const std::string& algorithm : algorithms) {
    for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
      for (int64_t rows : {static_cast<int64_t>(n() - 1), 67L}) {
        SCOPED_TRACE(absl::StrCat(algorithm, " ", client::DTypeName(dtype), " A[", rows, ", 33]"));
        const client::HostTensor a = RandomValues(dtype, {rows, 33}, rng_);
        const client::HostTensor b = RandomValues(dtype, {33, 19}, rng_);
        ASSERT_NO_FATAL_FAILURE(PutSharded("A", a));
        ASSERT_TRUE(node().Put("B", b, {.device = dev(0), .overwrite = true}).ok());
        v1::ExecuteRequest req = OneNode("matmul", {Stored("A"), Stored("B")}, "C");
        req.mutable_outputs(0)->set_overwrite(true);
        req.mutable_nodes(0)->set_algorithm(algorithm);
        absl::StatusOr<v1::ExecuteResponse> r = node().Execute(req);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->device(), ShardDevices(rows));
        const uint64_t copies = ExpectedShards(rows, n()).size() - 1;  // B is on the first's device
        EXPECT_EQ(r->peer_copy_bytes(), copies * Bytes(b)) << "B broadcast to the other shards";
        if (copies > 0) EXPECT_GT(r->timing().peer_copy_us(), 0);
        EXPECT_TRUE(
            MatchesReference("matmul", {a, b}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
        ASSERT_EQ(r->stored_size(), 1);
        EXPECT_TRUE(ShardedAs(r->stored(0), rows, 19 * 4, devices())) << "C is FLOAT32, by A's rows";
        absl::StatusOr<GotTensor> c = node().Get("C");
        ASSERT_TRUE(c.ok()) << c.status();
        EXPECT_TRUE(c->tensor.data == Output(*r, "n").data()) << "stored and returned C differ";
      }
    }
  }
}

// Any other use gathers the sharded tensor onto one device first (it fits here).
TEST_P(NodeShardingTest, TransposeAndMatmulWithShardedBGather) {
  const int64_t rows = 2L * n() + 1;
  const client::HostTensor x = RandomValues(v1::FLOAT32, {rows, 23}, rng_);
  ASSERT_NO_FATAL_FAILURE(PutSharded("x", x));
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("transpose", {Stored("x")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::count(devices().begin(), devices().end(), r->device()))
      << "a gathered graph runs on one device, not \"" << r->device() << "\"";
  EXPECT_GT(r->peer_copy_bytes(), 0u) << "gathering copies the other shards";
  EXPECT_TRUE(MatchesReference("transpose", {x}, Output(*r, "n"), "reference"));

  const client::HostTensor a = RandomValues(v1::FLOAT32, {9, rows}, rng_);
  ASSERT_TRUE(node().Put("a", a, {.device = dev(0)}).ok());
  r = node().Execute(OneNode("matmul", {Stored("a"), Stored("x")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(MatchesReference("matmul", {a, x}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
  // The stored tensor stays sharded.
  absl::StatusOr<v1::TensorInfo> listed = node().Listed("x");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(ShardedAs(*listed, rows, 23 * 4, devices()));
}

TEST_P(NodeShardingTest, MoveTensorGathersAShardedTensor) {
  const int64_t rows = 2L * n() + 1, cols = 31;
  const client::HostTensor x = RandomValues(v1::INT32, {rows, cols}, rng_);
  ASSERT_NO_FATAL_FAILURE(PutSharded("x", x));
  const int target = 1;
  uint64_t elsewhere = 0;  // the bytes of the shards not already on the target
  for (const ShardSpan& s : ExpectedShards(rows, n())) {
    if (s.device != target) elsewhere += s.rows * cols * 4;
  }
  absl::StatusOr<v1::MoveTensorResponse> moved = node().Move("x", dev(target));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->info().device(), dev(target));
  EXPECT_EQ(moved->info().shards_size(), 0) << "gathered: one part";
  EXPECT_EQ(moved->bytes(), elsewhere);
  absl::StatusOr<GotTensor> got = node().Get("x");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->info.device(), dev(target));
  EXPECT_EQ(got->info.shards_size(), 0);
  EXPECT_TRUE(got->tensor.data == x.data);
  absl::StatusOr<v1::ExecuteResponse> r = node().Execute(OneNode("row_sum", {Stored("x")}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device(), dev(target)) << "it runs where it was gathered";
  EXPECT_TRUE(MatchesReference("row_sum", {x}, Output(*r, "n"), NodeReport(*r, "n").algorithm()));
}

TEST_P(NodeShardingTest, OnlyRankTwoTensorsShard) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{12}, std::vector<int64_t>{4, 3, 2}, std::vector<int64_t>{},
        std::vector<int64_t>{2, 2, 2, 2}}) {
    SCOPED_TRACE(client::ShapeString(shape));
    const client::HostTensor t = RandomValues(v1::FLOAT32, shape, rng_);
    EXPECT_TRUE(StatusIs(node().Put("v", t, {.shard = true}).status(), Code::kInvalidArgument,
                         {"'v'", "shard"}));
  }
  // A sharded tensor has no one device.
  const client::HostTensor m = RandomValues(v1::FLOAT32, {6, 2}, rng_);
  EXPECT_TRUE(StatusIs(node().Put("v", m, {.device = dev(0), .shard = true}).status(),
                       Code::kInvalidArgument, {"'v'", "device"}));
  absl::StatusOr<std::vector<v1::TensorInfo>> list = node().List();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty()) << "a refused put stored '" << list->front().name() << "'";
  EXPECT_TRUE(Serving());
}

INSTANTIATE_NODE_TEST(NodeShardingTest);

}  // namespace
}  // namespace opserve::e2e
