// The API's contract, on whatever backend $OPSERVE_TEST_DEVICE names (the CPU in `make test`,
// the GPU in scripts/gpu-suite.sh), for every op of the op table linked into this test (the
// server's: ListOpsListsTheOpTable; a toy op's too, in e2e_toy_op_test):
//  - every (op, algorithm, dtype) that ListOps lists runs and gives the right answer, and the
//    op-level dtypes are exactly the union of the algorithms' dtypes;
//  - tensors with a zero-length dimension work through every path, and no kernel runs on them;
//  - an op ListOps lists that the table lacks fails the test, never passes unchecked;
//  - a request that fails late (deadline during its last node, cancelled mid-graph, expired on
//    arrival) stores nothing, and does not hold the device longer than the node it was running.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/device_worker.h"
#include "server/ops/op.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using Code = absl::StatusCode;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr v1::DType kAllDTypes[] = {v1::FLOAT32, v1::INT32, v1::INT64, v1::BFLOAT16};

float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// An element as a double; INT64 values here stay far below 2^53, so the conversion is exact.
double ElementAt(const client::HostTensor& t, int64_t i) {
  switch (t.dtype) {
    case v1::FLOAT32: return reinterpret_cast<const float*>(t.data.data())[i];
    case v1::INT32: return reinterpret_cast<const int32_t*>(t.data.data())[i];
    case v1::INT64: return static_cast<double>(reinterpret_cast<const int64_t*>(t.data.data())[i]);
    case v1::BFLOAT16: return Bf16ToFloat(reinterpret_cast<const uint16_t*>(t.data.data())[i]);
    default: return std::nan("");
  }
}
double ElementAt(const v1::Tensor& t, int64_t i) {
  client::HostTensor h;
  h.dtype = t.dtype();
  h.data = t.data();
  return ElementAt(h, i);
}

// Values every dtype holds exactly and every summation order adds exactly: small nonzero integers
// (bfloat16 holds integers up to 256 exactly; the sums below stay in float32's exact range).
client::HostTensor SmallIntegers(v1::DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  client::HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.data.resize(*client::ByteSize(dtype, t.shape));
  std::uniform_int_distribution<int> v(-8, 8);
  for (int64_t i = 0; i < n; ++i) {
    int x = v(rng);
    if (x == 0) x = 3;
    switch (dtype) {
      case v1::FLOAT32: reinterpret_cast<float*>(t.data.data())[i] = static_cast<float>(x); break;
      case v1::INT32: reinterpret_cast<int32_t*>(t.data.data())[i] = x; break;
      case v1::INT64: reinterpret_cast<int64_t*>(t.data.data())[i] = int64_t{x} << 33; break;
      case v1::BFLOAT16: {
        const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(x));
        reinterpret_cast<uint16_t*>(t.data.data())[i] = static_cast<uint16_t>(bits >> 16);
        break;
      }
      default: break;
    }
  }
  return t;
}

// The expected result: the op table's CPU reference row run here, in this process, on the same
// inputs. With exact inputs every summation order gives the same bits, so the server's answer on
// any backend must match it up to the one rounding of a mean's division.
std::vector<double> Expected(const OpSpec& op, const std::vector<client::HostTensor>& in) {
  std::vector<TensorMeta> metas;
  std::vector<const void*> ptrs;
  for (const client::HostTensor& t : in) {
    metas.push_back({static_cast<DType>(t.dtype), t.shape});
    ptrs.push_back(t.data.data());
  }
  absl::StatusOr<TensorMeta> out_meta = op.infer(metas);
  if (!out_meta.ok()) {
    ADD_FAILURE() << op.name << ": " << out_meta.status();
    return {};
  }
  client::HostTensor out;
  out.dtype = static_cast<v1::DType>(out_meta->dtype);
  out.shape = out_meta->shape;
  out.data.resize(out_meta->Bytes());
  static Backend* const cpu = MakeCpuBackend(0).release();
  static ExecEnv* const env = cpu->NewExecEnv()->release();
  AttrMap attrs;
  KernelArgs args{ptrs, metas, out.data.data(), *out_meta, attrs, *env};
  if (absl::Status s = CpuReference(op.name)->run(args); !s.ok()) {
    ADD_FAILURE() << op.name << ": the CPU reference failed: " << s;
    return {};
  }
  (void)env->Finish(0);
  std::vector<double> y(out_meta->NumElements());
  for (size_t i = 0; i < y.size(); ++i) y[i] = ElementAt(out, static_cast<int64_t>(i));
  return y;
}

class ContractTest : public OpserveTest {};

// ListOps lists exactly the ops of the table that have a row of the server's backend: the table
// this test reads is the server's.
TEST_F(ContractTest, ListOpsListsTheOpTable) {
  absl::StatusOr<v1::ListOpsResponse> ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::set<std::string> listed, table;
  for (const v1::OpInfo& op : ops->ops()) listed.insert(op.name());
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend == ops->backend()) table.insert(std::string(a.op));
  }
  EXPECT_EQ(listed, table) << "the server's ops and this test's op table differ";
}

// Every pair ListOps lists runs, answers right, and reports an algorithm ListOps lists; a dtype
// it does not list is refused. The op-level dtypes are the union of the algorithms' dtypes.
TEST_F(ContractTest, EveryListedOpAlgorithmAndDtypeRuns) {
  absl::StatusOr<v1::ListOpsResponse> ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  int ran = 0;
  for (const v1::OpInfo& op : ops->ops()) {
    SCOPED_TRACE(op.name());
    std::set<int> from_algorithms, names;
    std::set<std::string> algorithm_names;
    for (const v1::AlgorithmInfo& a : op.algorithms()) {
      from_algorithms.insert(a.dtypes().begin(), a.dtypes().end());
      algorithm_names.insert(a.name());
    }
    EXPECT_EQ(std::set<int>(op.dtypes().begin(), op.dtypes().end()), from_algorithms)
        << "the op's dtypes are not the union of its algorithms' dtypes";
    // What the op table (and docs/API.md's "Ops and dtypes") promises on every backend.
    const OpSpec* spec = FindOp(op.name());
    ASSERT_NE(spec, nullptr) << "ListOps lists an op the table lacks";
    std::set<int> promised;
    for (DType d : spec->dtypes) promised.insert(static_cast<int>(d));
    EXPECT_EQ(from_algorithms, promised)
        << "this backend does not run every dtype the API lists for " << op.name();
    for (const v1::AlgorithmInfo& a : op.algorithms()) {
      for (v1::DType dtype : kAllDTypes) {
        SCOPED_TRACE(absl::StrCat(a.name(), " ", v1::DType_Name(dtype)));
        const bool listed = std::find(a.dtypes().begin(), a.dtypes().end(), dtype) != a.dtypes().end();
        v1::ExecuteRequest req;
        std::vector<client::HostTensor> inputs;
        std::vector<In> refs;
        // The op's largest small shape: past a warp, not a multiple of 32 in places.
        for (const auto& shape : spec->test.small_shapes.back()) {
          const std::string name = absl::StrCat("x", inputs.size());
          inputs.push_back(SmallIntegers(dtype, shape, rng_));
          AddInline(req, name, inputs.back());
          refs.push_back(Inline(name));
        }
        AddNode(req, "n", op.name(), refs, a.name());
        AddOutput(req, "n", true);
        absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
        if (!listed) {
          ASSERT_FALSE(resp.ok()) << "ran a dtype ListOps does not list for it";
          EXPECT_TRUE(resp.status().code() == Code::kUnimplemented ||
                      resp.status().code() == Code::kInvalidArgument)
              << resp.status();
          continue;
        }
        ASSERT_TRUE(resp.ok()) << resp.status();
        ++ran;
        ASSERT_EQ(resp->nodes_size(), 1);
        EXPECT_EQ(algorithm_names.count(resp->nodes(0).algorithm()), 1u)
            << "reported algorithm " << resp->nodes(0).algorithm() << " is not listed";
        const std::vector<double> want = Expected(*spec, inputs);
        const v1::Tensor& got = resp->outputs(0).tensor();
        ASSERT_EQ(got.data().size() / (got.dtype() == v1::INT64 ? 8 : got.dtype() == v1::BFLOAT16 ? 2 : 4),
                  want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          const double g = ElementAt(got, static_cast<int64_t>(i));
          // Exact inputs: only the mean's division rounds (once into float32).
          ASSERT_NEAR(g, want[i], 1e-6 * std::abs(want[i])) << "element " << i;
        }
      }
    }
  }
  EXPECT_GT(ran, 0);
}

// ---- empty tensors ----

client::HostTensor EmptyTensor(v1::DType dtype, std::vector<int64_t> shape) {
  client::HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

// An op's empty cases, from its test model: each small case with every dimension of one size set
// to 0 (all of them at once, so that sizes which must agree, matmul's K, still do).
std::vector<std::vector<std::vector<int64_t>>> EmptyCases(const OpSpec& op) {
  std::set<std::vector<std::vector<int64_t>>> cases;
  for (const std::vector<std::vector<int64_t>>& shapes : op.test.small_shapes) {
    std::set<int64_t> sizes;
    for (const auto& shape : shapes) sizes.insert(shape.begin(), shape.end());
    for (int64_t size : sizes) {
      std::vector<std::vector<int64_t>> c = shapes;
      for (auto& shape : c) std::replace(shape.begin(), shape.end(), size, int64_t{0});
      cases.insert(std::move(c));
    }
  }
  return {cases.begin(), cases.end()};
}

// Every op on every dtype with an empty input answers what the table says without running a
// kernel: the shape and dtype its shape rule infers, filled as its EmptyFill says; or, where
// the shape rule refuses empty inputs, the same refusal. An op ListOps lists that this test's
// table lacks, or a fill it does not know, fails: it cannot tell what the answer should be.
TEST_F(ContractTest, EmptyTensorsRunEveryOpWithoutAKernel) {
  absl::StatusOr<v1::ListOpsResponse> ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  for (const v1::OpInfo& op : ops->ops()) {
    const OpSpec* spec = FindOp(op.name());
    ASSERT_NE(spec, nullptr) << "ListOps lists op " << op.name()
                             << ", which this test's op table lacks: it cannot check it";
    const auto cases = EmptyCases(*spec);
    EXPECT_FALSE(cases.empty()) << op.name() << ": its test model has no shape to empty";
    for (const auto& shapes : cases) {
      for (int dtype : op.dtypes()) {
        const auto dt = static_cast<v1::DType>(dtype);
        SCOPED_TRACE(absl::StrCat(op.name(), " ", v1::DType_Name(dt), " ",
                                  client::ShapeString(shapes[0])));
        v1::ExecuteRequest req;
        std::vector<In> refs;
        std::vector<TensorMeta> metas;
        for (size_t i = 0; i < shapes.size(); ++i) {
          const std::string name = absl::StrCat("e", i);
          metas.push_back({static_cast<DType>(dtype), shapes[i]});
          AddInline(req, name, metas.back().NumElements() == 0 ? EmptyTensor(dt, shapes[i])
                                                               : SmallIntegers(dt, shapes[i], rng_));
          refs.push_back(Inline(name));
        }
        AddNode(req, "n", op.name(), refs);
        AddOutput(req, "n", true);
        absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
        const absl::StatusOr<TensorMeta> want = spec->infer(metas);
        if (!want.ok()) {
          EXPECT_TRUE(StatusIs(resp.status(), want.status().code())) << resp.status();
          continue;
        }
        ASSERT_TRUE(resp.ok()) << resp.status();
        const v1::NodeResult& r = resp->nodes(0);
        EXPECT_EQ(r.kernel_us(), 0.0) << "a kernel ran on zero elements";
        EXPECT_FALSE(r.algorithm().empty());
        EXPECT_NE(r.algorithm(), "auto");
        const v1::Tensor& t = resp->outputs(0).tensor();
        EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()), want->shape);
        EXPECT_EQ(static_cast<int>(t.dtype()), static_cast<int>(want->dtype));
        // What numpy answers: 0 for sums of nothing, NaN for means of nothing, zeros for a
        // product over K = 0.
        for (int64_t i = 0; i < want->NumElements(); ++i) {
          const double v = ElementAt(t, i);
          switch (spec->empty_fill) {
            case EmptyFill::kZeros:
              EXPECT_EQ(v, 0.0) << "element " << i;
              break;
            case EmptyFill::kNaN:
              EXPECT_TRUE(std::isnan(v)) << "element " << i << " = " << v;
              break;
            default:
              FAIL() << "an EmptyFill this test does not know: "
                     << static_cast<int>(spec->empty_fill);
          }
        }
      }
    }
  }
}

// Stored, returned, intermediate and store_as paths with an empty tensor.
TEST_F(ContractTest, EmptyTensorsThroughTheStoreAndIntermediates) {
  ASSERT_TRUE(client().PutTensor("E", EmptyTensor(v1::FLOAT32, {0, 6}), false).ok());
  v1::ExecuteRequest req;
  AddNode(req, "t", "transpose", {Stored("E")});         // [6, 0], an intermediate
  AddNode(req, "rs", "row_sum", {Node("t")});           // [6] zeros
  AddNode(req, "s", "sum", {Node("rs")});               // 0, over a non-empty input
  AddOutput(req, "t", false, "ET");
  AddOutput(req, "s", true);
  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->outputs_size(), 1);
  EXPECT_EQ(ElementAt(resp->outputs(0).tensor(), 0), 0.0);
  absl::StatusOr<client::HostTensor> et = client().GetTensor("ET");
  ASSERT_TRUE(et.ok()) << et.status();
  EXPECT_EQ(et->shape, (std::vector<int64_t>{6, 0}));
  EXPECT_TRUE(et->data.empty());
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
  for (const v1::TensorInfo& info : *list) EXPECT_EQ(info.bytes(), 0u) << info.name();
  ASSERT_TRUE(client().DeleteTensor("ET").ok());
}

double SecondsOfASmallRequest(client::Client& c);

// A node skipped for its empty input sits between kernels, on a fresh server: that request and
// the next ones run (the skipped node's timing marks are recorded like any other's).
TEST_F(ContractTest, EmptyNodesBetweenKernelsKeepTheWorkerHealthy) {
  v1::ExecuteRequest req;
  AddInline(req, "x", F32({4}, {1, 2, 3, 4}));
  AddInline(req, "e", EmptyTensor(v1::FLOAT32, {0}));
  AddNode(req, "a", "sum", {Inline("x")});
  AddNode(req, "b", "sum", {Inline("e")});
  AddNode(req, "c", "sum", {Inline("x")});
  AddNode(req, "d", "sum", {Inline("e")});
  AddOutput(req, "a", true);
  AddOutput(req, "b", true);
  AddOutput(req, "c", true);
  AddOutput(req, "d", true);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->nodes_size(), 4);
    EXPECT_GT(resp->nodes(0).kernel_us(), 0);
    EXPECT_EQ(resp->nodes(1).kernel_us(), 0);
    EXPECT_EQ(ElementAt(resp->outputs(0).tensor(), 0), 10.0);
    EXPECT_EQ(ElementAt(resp->outputs(1).tensor(), 0), 0.0);
  }
  EXPECT_LT(SecondsOfASmallRequest(client()), 5.0);  // and it succeeded (checked inside)
}

// ---- failed requests change nothing, also when they fail late ----

// A matmul of stored n x n operands slow enough (`seconds` or more) to fail inside: the
// backend's slowest algorithm, grown until one node takes that long.
struct SlowNode {
  int64_t n = 0;
  std::string algorithm;
  double seconds = 0;  // one node, measured
};

absl::StatusOr<SlowNode> PrepareSlowNode(client::Client& c, double seconds, std::mt19937_64& rng) {
  SlowNode s;
  s.algorithm = OpserveTest::Device() == "cpu" ? "reference" : "naive";
  const int64_t max_n = OpserveTest::Device() == "cpu" ? 1536 : 8192;
  for (s.n = OpserveTest::Device() == "cpu" ? 192 : 1024;; s.n = std::min(max_n, s.n * 2)) {
    absl::StatusOr<std::vector<float>> sums = StoreExactMatmulInputs(c, "slow_a", "slow_b", s.n, rng);
    if (!sums.ok()) return sums.status();
    v1::ExecuteRequest r;
    AddNode(r, "m", "matmul", {Stored("slow_a"), Stored("slow_b")}, s.algorithm);
    AddOutput(r, "m", false, "slow_c", /*overwrite=*/true);
    for (int warm = 0; warm < 2; ++warm) {
      absl::StatusOr<v1::ExecuteResponse> resp = c.Execute(r);
      if (!resp.ok()) return resp.status();
      s.seconds = resp->nodes(0).kernel_us() * 1e-6;
    }
    if (s.seconds >= seconds || s.n == max_n) return s;
  }
}

v1::ExecuteRequest SlowChain(const SlowNode& s, int nodes, const std::string& store_as) {
  v1::ExecuteRequest r;
  for (int i = 0; i < nodes; ++i) {
    AddNode(r, absl::StrCat("m", i), "matmul", {Stored("slow_a"), Stored("slow_b")}, s.algorithm);
  }
  AddOutput(r, absl::StrCat("m", nodes - 1), false, store_as);
  return r;
}

// The time a small request takes end to end: how long the device stays busy with what came
// before it.
double SecondsOfASmallRequest(client::Client& c) {
  v1::ExecuteRequest small;
  AddInline(small, "x", F32({2}, {1.f, 2.f}));
  AddNode(small, "s", "sum", {Inline("x")});
  AddOutput(small, "s", true);
  const auto start = Clock::now();
  absl::StatusOr<v1::ExecuteResponse> r = c.Execute(small);
  EXPECT_TRUE(r.ok()) << r.status();
  return SecondsSince(start);
}

bool IsStored(client::Client& c, const std::string& name) {
  absl::StatusOr<std::vector<v1::TensorInfo>> list = c.ListTensors();
  EXPECT_TRUE(list.ok()) << list.status();
  if (!list.ok()) return true;
  for (const v1::TensorInfo& t : *list) {
    if (t.name() == name) return true;
  }
  return false;
}

// One lane: a second request waits in the queue behind the first instead of running beside it,
// so "the device is free again" can be read off a small request's latency.
class OneLaneContractTest : public ContractTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--lanes=1"}; }
};

// The deadline passes while the graph's only node runs: the node finishes on the device, but its
// store_as output must not appear. (Before the commit checked the deadline, it did.)
TEST_F(OneLaneContractTest, DeadlineDuringTheLastNodeStoresNothing) {
  absl::StatusOr<SlowNode> slow = PrepareSlowNode(client(), 0.3, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_TRUE(client().PutTensor("keep", RandomTensor(v1::INT64, {1000}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  // A fifth of the node: the node, timed under load, may run faster now (see below).
  const double deadline_s = slow->seconds / 5;
  const absl::Status s =
      client().Execute(SlowChain(*slow, 1, "OUT"), {.timeout = absl::Seconds(deadline_s)}).status();
  EXPECT_TRUE(StatusIs(s, Code::kDeadlineExceeded)) << s;
  // The worker is done with the node once a later request has been answered.
  const double next_s = SecondsOfASmallRequest(client());
  std::cout << "[ DEADLINE ] node " << slow->seconds << " s (n = " << slow->n << "), deadline "
            << deadline_s << " s; the next request took " << next_s << " s" << std::endl;
  EXPECT_LT(next_s, slow->seconds + 0.5) << "the next request waited for more than the node";
  EXPECT_FALSE(IsStored(client(), "OUT")) << "the expired request stored its output";
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
}

// A client cancels during the second of twelve long nodes: nothing is stored, and the device
// is free again within about one node (the running one; one more may be queued behind it).
// Twelve, not fewer: a node timed while a parallel test held the CPU can later run several times
// faster, and four such nodes once finished before the cancel reached the server.
TEST_F(OneLaneContractTest, CancelMidGraphStoresNothingAndFreesTheDevice) {
  absl::StatusOr<SlowNode> slow = PrepareSlowNode(client(), 0.25, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  const StoreSnapshot before = Snapshot(client());
  constexpr int kNodes = 12;
  BackgroundExecute call(stub(), SlowChain(*slow, kNodes, "OUT"));
  std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * slow->seconds));
  const bool finished_early = call.done();
  call.Cancel();
  const auto cancelled_at = Clock::now();
  const grpc::Status status = call.Wait();
  ASSERT_FALSE(finished_early) << "the graph finished before it could be cancelled";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  const double next_s = SecondsOfASmallRequest(client());
  const double since_cancel = SecondsSince(cancelled_at);
  std::cout << "[ CANCEL   ] " << kNodes << " nodes of " << slow->seconds
            << " s; a request sent after the cancel took " << next_s << " s" << std::endl;
  // Running on: about 10.5 more nodes. Abandoned: the rest of the running node, and at most one
  // node queued behind it.
  EXPECT_LT(since_cancel, 2.0 * slow->seconds + 0.5) << "the device kept running the graph";
  EXPECT_FALSE(IsStored(client(), "OUT")) << "the cancelled request stored its output";
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
}

// A request whose deadline passes while it waits for the device (behind long nodes that hold
// every context of the lane: one running, the others launched behind it) is never started:
// nothing of it is stored, and the device is free once the long nodes are done.
TEST_F(OneLaneContractTest, DeadlinePassedInTheQueueRunsNothing) {
  absl::StatusOr<SlowNode> slow = PrepareSlowNode(client(), 0.3, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  const StoreSnapshot before = Snapshot(client());
  // The long nodes go first; then one whose deadline ends while it waits behind them.
  std::atomic<int> sent{0};
  std::vector<std::thread> busy;
  for (int i = 0; i < DeviceWorker::kDefaultContextsPerLane; ++i) {
    busy.emplace_back([&, i] {
      ++sent;
      EXPECT_TRUE(client().Execute(SlowChain(*slow, 1, "BUSY" + std::to_string(i))).ok());
    });
  }
  while (sent.load() < DeviceWorker::kDefaultContextsPerLane) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::duration<double>(0.2 * slow->seconds));
  const absl::Status s = client()
                             .Execute(SlowChain(*slow, 1, "OUT"),
                                      {.timeout = absl::Seconds(0.3 * slow->seconds)})
                             .status();
  EXPECT_TRUE(StatusIs(s, Code::kDeadlineExceeded)) << s;
  for (std::thread& t : busy) t.join();
  // Had the expired request run after the others, this one would wait for its whole node.
  const double next_s = SecondsOfASmallRequest(client());
  std::cout << "[ QUEUED   ] node " << slow->seconds << " s; after it, a request took " << next_s
            << " s" << std::endl;
  EXPECT_LT(next_s, 0.5 * slow->seconds + 0.3) << "the expired request ran after all";
  EXPECT_FALSE(IsStored(client(), "OUT")) << "the expired request stored its output";
  for (int i = 0; i < DeviceWorker::kDefaultContextsPerLane; ++i) {
    const std::string name = "BUSY" + std::to_string(i);
    ASSERT_TRUE(IsStored(client(), name));
    ASSERT_TRUE(client().DeleteTensor(name).ok());
  }
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
}

// A deadline that has passed by the time the request arrives (a large inline upload outlasts a
// short deadline): the server answers DEADLINE_EXCEEDED and neither plans nor runs it.
TEST_F(ContractTest, DeadlinePassedOnArrivalRunsNothing) {
  const StoreSnapshot before = Snapshot(client());
  v1::ExecuteRequest req;
  AddInline(req, "big", RandomTensor(v1::FLOAT32, {16 << 20}, rng_));  // 64 MiB
  AddNode(req, "s", "sum", {Inline("big")});
  AddOutput(req, "s", false, "OUT");
  const absl::Status s = client().Execute(req, {.timeout = absl::Milliseconds(5)}).status();
  EXPECT_TRUE(StatusIs(s, Code::kDeadlineExceeded)) << s;
  EXPECT_LT(SecondsOfASmallRequest(client()), 1.0);
  EXPECT_FALSE(IsStored(client(), "OUT"));
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  EXPECT_TRUE(Serving());
}

}  // namespace
}  // namespace opserve::e2e
