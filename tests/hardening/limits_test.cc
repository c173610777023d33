// Limits: each one enforced by the real server, answered with a status that names it, and
// leaving the server serving and its store unchanged.
//   --max_message_bytes   a too-large inline Execute, and too-large returned outputs
//   --max_tensor_bytes    on PutTensor, on inline tensors and on intermediates
//   --max_graph_nodes
//   --memory_budget_bytes on uploads (also concurrent ones), inline inputs and intermediates
//   --max_inflight        a bounded device queue under many concurrent slow requests
//   deadlines             DEADLINE_EXCEEDED, the rest of the graph abandoned
//   cancellation          CANCELLED, the request's memory given back
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <barrier>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/hardening/hardening_support.h"

namespace opserve::hardening {
namespace {

using Code = absl::StatusCode;

// ---------------------------------------------------------------------------------------------
// --max_message_bytes

class MessageLimitTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_message_bytes=", 4 * kMiB)};
  }
};

TEST_F(MessageLimitTest, OversizedInlineExecuteIsResourceExhaustedAndNamesTheLimit) {
  ASSERT_TRUE(client().PutTensor("keep", RandomTensor(v1::FLOAT32, {64}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  const uint64_t used = UsedBytes();

  v1::ExecuteRequest big;
  AddInline(big, "x", v1::FLOAT32, {static_cast<int64_t>(5 * kMiB / 4)});  // 5 MiB > 4 MiB
  AddNode(big, "s", "sum", {Inline("x")});
  AddOutput(big, "s", true, "s_out");
  const absl::Status s = client().Execute(big).status();
  // gRPC refuses the message before any handler runs; its message gives the limit's value.
  EXPECT_TRUE(StatusIs(s, Code::kResourceExhausted, {"4194304"})) << s;
  std::cout << "[ MESSAGE  ] a 5 MiB Execute to a 4 MiB server: " << s << std::endl;
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  EXPECT_EQ(UsedBytes(), used);

  // Under the limit, the same graph runs.
  v1::ExecuteRequest small;
  AddInline(small, "x", F32({3}, {1.f, 2.f, 3.5f}));
  AddNode(small, "s", "sum", {Inline("x")});
  AddOutput(small, "s", true);
  absl::StatusOr<v1::ExecuteResponse> ok = client().Execute(small);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(Floats(ok->outputs(0).tensor().data()), std::vector<float>{6.5f});
}

// The response direction: outputs returned inline that total more than the limit are refused
// before they run, with the flag in the message; stored, the same tensor is fine, and it comes
// back through GetTensor in chunks that each fit.
TEST_F(MessageLimitTest, ReturnedOutputsOverTheLimitAreRefusedAndStoringThemWorks) {
  v1::ExecuteRequest r;
  AddInline(r, "col", v1::FLOAT32, {2048, 1});
  AddInline(r, "row", v1::FLOAT32, {1, 1024});
  AddNode(r, "outer", "matmul", {Inline("col"), Inline("row")});  // 8 MiB
  AddOutput(r, "outer", true);
  EXPECT_TRUE(StatusIs(client().Execute(r).status(), Code::kResourceExhausted,
                       {"--max_message_bytes", "8388608"}));
  EXPECT_TRUE(client().ListTensors()->empty());

  r.mutable_outputs(0)->set_return_inline(false);
  r.mutable_outputs(0)->set_store_as("outer");
  ASSERT_TRUE(client().Execute(r).ok());
  absl::StatusOr<client::HostTensor> back = client().GetTensor("outer");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data.size(), 8 * kMiB);
  // And an upload of 8 MiB goes through in chunks under the limit.
  EXPECT_TRUE(client().PutTensor("up", RandomTensor(v1::FLOAT32, {2 * 1024 * 1024}, rng_), false).ok());
  EXPECT_TRUE(Serving());
}

// ---------------------------------------------------------------------------------------------
// --max_tensor_bytes

class TensorLimitTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_tensor_bytes=", kMiB), absl::StrCat("--max_message_bytes=", 8 * kMiB)};
  }
};

TEST_F(TensorLimitTest, PutOverTheLimitIsRefusedAtTheHeader) {
  ASSERT_TRUE(client().PutTensor("keep", RandomTensor(v1::INT32, {10}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  const uint64_t used = UsedBytes();

  EXPECT_TRUE(StatusIs(
      client().PutTensor("big", RandomTensor(v1::FLOAT32, {262145}, rng_), false).status(),
      Code::kResourceExhausted, {"'big'", "1048580", "1048576", "--max_tensor_bytes"}));
  // A header alone, claiming more than the limit, is refused before any byte is reserved.
  {
    grpc::ClientContext ctx;
    v1::PutTensorResponse resp;
    auto w = stub().PutTensor(&ctx, &resp);
    v1::PutTensorRequest header;
    header.mutable_header()->set_name("claim");
    header.mutable_header()->set_dtype(v1::INT64);
    header.mutable_header()->add_shape(int64_t{1} << 40);
    w->Write(header);
    const grpc::Status s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("--max_tensor_bytes"), std::string::npos) << s.error_message();
  }
  // A shape whose byte count overflows 64 bits must not wrap around to a small size.
  {
    grpc::ClientContext ctx;
    v1::PutTensorResponse resp;
    auto w = stub().PutTensor(&ctx, &resp);
    v1::PutTensorRequest header;
    header.mutable_header()->set_name("wrap");
    header.mutable_header()->set_dtype(v1::FLOAT32);
    for (int64_t d : {int64_t{1} << 32, int64_t{1} << 31, int64_t{4}}) header.mutable_header()->add_shape(d);
    w->Write(header);
    v1::PutTensorRequest chunk;
    chunk.set_chunk(std::string(16, '\0'));
    w->Write(chunk);
    w->WritesDone();
    const grpc::Status s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  EXPECT_EQ(UsedBytes(), used);
  // At the limit is fine.
  EXPECT_TRUE(client().PutTensor("at", RandomTensor(v1::FLOAT32, {262144}, rng_), false).ok());
}

TEST_F(TensorLimitTest, InlineAndIntermediateTensorsOverTheLimit) {
  v1::ExecuteRequest in;
  AddInline(in, "big", v1::FLOAT32, {262145});
  AddNode(in, "s", "sum", {Inline("big")});
  AddOutput(in, "s", true);
  EXPECT_TRUE(StatusIs(client().Execute(in).status(), Code::kResourceExhausted,
                       {"inline tensor 'big'", "--max_tensor_bytes"}));

  // Inputs within the limit whose product is not: [1024 x 1] x [1 x 257] floats is 1052672 B.
  v1::ExecuteRequest mid;
  AddInline(mid, "col", v1::FLOAT32, {1024, 1});
  AddInline(mid, "row", v1::FLOAT32, {1, 257});
  AddNode(mid, "outer", "matmul", {Inline("col"), Inline("row")});
  AddNode(mid, "s", "sum", {Node("outer")});
  AddOutput(mid, "s", true);
  EXPECT_TRUE(StatusIs(client().Execute(mid).status(), Code::kResourceExhausted,
                       {"'outer'", "1052672", "--max_tensor_bytes"}));
  EXPECT_TRUE(Serving());

  // [1024 x 1] x [1 x 256] is exactly 1 MiB: allowed.
  mid.mutable_inline_tensors()->erase("row");
  AddInline(mid, "row", v1::FLOAT32, {1, 256});
  absl::StatusOr<v1::ExecuteResponse> ok = client().Execute(mid);
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(client().ListTensors()->empty());
}

// ---------------------------------------------------------------------------------------------
// --max_graph_nodes

class GraphLimitTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--max_graph_nodes=8"}; }
};

v1::ExecuteRequest SumChain(int nodes) {
  v1::ExecuteRequest r;
  AddInline(r, "x", F32({2, 2}, {1, 2, 3, 4}));
  AddNode(r, "t0", "transpose", {Inline("x")});
  for (int i = 1; i < nodes - 1; ++i) {
    AddNode(r, absl::StrCat("t", i), "transpose", {Node(absl::StrCat("t", i - 1))});
  }
  AddNode(r, "s", "sum", {Node(absl::StrCat("t", nodes - 2))});
  AddOutput(r, "s", true);
  return r;
}

TEST_F(GraphLimitTest, OneNodeOverTheLimitIsRefusedAndTheLimitItselfRuns) {
  EXPECT_TRUE(StatusIs(client().Execute(SumChain(9)).status(), Code::kResourceExhausted,
                       {"9 nodes", "8", "--max_graph_nodes"}));
  absl::StatusOr<v1::ExecuteResponse> ok = client().Execute(SumChain(8));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->nodes_size(), 8);
  EXPECT_EQ(Floats(ok->outputs(0).tensor().data()), std::vector<float>{10.f});
}

// A hostile graph far over the limit is refused by counting, before any per-node work: it is
// answered about as fast as a small one.
TEST_F(GraphLimitTest, HugeGraphIsRefusedCheaply) {
  v1::ExecuteRequest huge;
  for (int i = 0; i < 200000; ++i) AddNode(huge, absl::StrCat("n", i), "sum", {Node("n0")});
  const auto start = Clock::now();
  EXPECT_TRUE(StatusIs(client().Execute(huge).status(), Code::kResourceExhausted,
                       {"200000 nodes", "--max_graph_nodes"}));
  const double took = SecondsSince(start);
  EXPECT_LT(took, 10.0);
  std::cout << "[ HUGE     ] 200000-node graph refused in " << took << " s" << std::endl;
  EXPECT_TRUE(Serving());
}

// ---------------------------------------------------------------------------------------------
// Names are limited too (1..256 bytes of [A-Za-z0-9_.:/-]): whatever name a request carries, the
// answer is INVALID_ARGUMENT or NOT_FOUND with a message of bounded size. A status message rides
// in the HTTP/2 trailers, and one that echoes a long name exceeds the client's metadata limit
// (16 KiB by default): the client then sees RESOURCE_EXHAUSTED "received initial metadata size
// exceeds limit" instead of the server's answer.

TEST_F(HardeningTest, HostileNamesGetABoundedAnswerOnEveryRpc) {
  ASSERT_TRUE(client().PutTensor("keep", RandomTensor(v1::FLOAT32, {4}, rng_), false).ok());
  constexpr size_t kMaxMessage = 1024;
  for (const std::string& name :
       {std::string(257, 'n'), std::string(20000, 'n'), std::string(200000, 'n'),
        std::string("line\nbreak"), std::string("tab\there"), std::string("sp ace")}) {
    SCOPED_TRACE(absl::StrCat("a name of ", name.size(), " bytes starting '", name.substr(0, 12),
                              "'"));
    auto bounded = [&](const absl::Status& s, const std::string& rpc) {
      EXPECT_TRUE(s.code() == Code::kInvalidArgument || s.code() == Code::kNotFound)
          << rpc << ": " << absl::StatusCodeToString(s.code()) << " "
          << s.message().substr(0, 200);
      EXPECT_LT(s.message().size(), kMaxMessage)
          << rpc << " echoed the name: a " << s.message().size() << "-byte message";
    };
    bounded(client().PutTensor(name, RandomTensor(v1::FLOAT32, {4}, rng_), false).status(),
            "PutTensor");
    bounded(client().GetTensor(name).status(), "GetTensor");
    bounded(client().DeleteTensor(name).status(), "DeleteTensor");
    v1::ExecuteRequest stored;
    AddNode(stored, "s", "sum", {Stored(name)});
    AddOutput(stored, "s", true);
    bounded(client().Execute(stored).status(), "Execute (stored input)");
    v1::ExecuteRequest in;
    AddInline(in, name, F32({1}, {1.f}));
    AddNode(in, "s", "sum", {Inline(name)});
    AddOutput(in, "s", true);
    bounded(client().Execute(in).status(), "Execute (inline tensor)");
    v1::ExecuteRequest out;
    AddNode(out, "s", "sum", {Stored("keep")});
    AddOutput(out, "s", false, name);
    bounded(client().Execute(out).status(), "Execute (store_as)");
  }
  EXPECT_TRUE(Serving());
  EXPECT_EQ(client().ListTensors()->size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// --memory_budget_bytes

class BudgetTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", 8 * kMiB)};
  }
};

TEST_F(BudgetTest, BudgetMetricIsTheFlag) {
  absl::StatusOr<double> budget = Metric("opserve_device_memory_bytes", {"kind=\"budget\""});
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(*budget, 8.0 * kMiB);
  EXPECT_EQ(UsedBytes(), 0u);
}

TEST_F(BudgetTest, UploadOverTheBudgetChangesNothing) {
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {1024, 1024}, rng_), false).ok());
  ASSERT_TRUE(client().PutTensor("B", RandomTensor(v1::FLOAT32, {768, 1024}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  ASSERT_EQ(UsedBytes(), 7 * kMiB);

  EXPECT_TRUE(StatusIs(
      client().PutTensor("C", RandomTensor(v1::FLOAT32, {512, 1024}, rng_), false).status(),
      Code::kResourceExhausted, {"'C'", "budget", "--memory_budget_bytes"}));
  // An overwrite needs room for the new bytes while the old ones are still held.
  EXPECT_TRUE(StatusIs(
      client().PutTensor("A", RandomTensor(v1::FLOAT32, {512, 1024}, rng_), true).status(),
      Code::kResourceExhausted, {"'A'", "--memory_budget_bytes"}));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  EXPECT_EQ(UsedBytes(), 7 * kMiB);
}

TEST_F(BudgetTest, InlineInputsAndIntermediatesOverTheBudgetChangeNothing) {
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {1024, 1024}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  ASSERT_EQ(UsedBytes(), 4 * kMiB);

  // An inline input that does not fit next to A.
  v1::ExecuteRequest in;
  AddInline(in, "x", v1::FLOAT32, {static_cast<int64_t>(5 * kMiB / 4)});
  AddNode(in, "s", "sum", {Inline("x")});
  AddOutput(in, "s", true, "s_out");
  EXPECT_TRUE(StatusIs(client().Execute(in).status(), Code::kResourceExhausted,
                       {"inline tensor 'x'", "--memory_budget_bytes"}));

  // Two nodes run (a sum and a 2 MiB row reduction's input), the third's 4 MiB intermediate
  // does not fit: nothing is stored, A is not overwritten, and every byte the request held is
  // back afterwards.
  v1::ExecuteRequest mid;
  AddNode(mid, "s", "sum", {Stored("A")});
  AddNode(mid, "r", "row_sum", {Stored("A")});
  AddNode(mid, "t", "transpose", {Stored("A")});
  // Unfused, so that the transpose is an intermediate (fused, the column sum reads A in place).
  (*AddNode(mid, "rt", "row_sum", {Node("t")})->mutable_attrs())["fuse"].set_b(false);
  AddOutput(mid, "s", true, "A", /*overwrite=*/true);
  AddOutput(mid, "r", false, "r_out");
  AddOutput(mid, "rt", false, "rt_out");
  EXPECT_TRUE(StatusIs(client().Execute(mid).status(), Code::kResourceExhausted,
                       {"'t'", "--memory_budget_bytes"}));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  EXPECT_EQ(UsedBytes(), 4 * kMiB);

  // With room, the same graph runs.
  ASSERT_TRUE(client().DeleteTensor("A").ok());
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {512, 1024}, rng_), false).ok());
  absl::StatusOr<v1::ExecuteResponse> ok = client().Execute(mid);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// Uploads racing for the budget: never more is held than the budget, exactly the ones told OK
// are stored, and deleting them all brings the used bytes back to zero.
TEST_F(BudgetTest, ConcurrentUploadsNeverOvercommit) {
  constexpr int kThreads = 8;
  std::vector<std::unique_ptr<client::Client>> clients;
  for (int i = 0; i < kThreads; ++i) clients.push_back(NewClient());
  std::vector<absl::Status> results(kThreads);
  std::vector<client::HostTensor> tensors;
  for (int i = 0; i < kThreads; ++i) tensors.push_back(RandomTensor(v1::FLOAT32, {3 * 1024 * 256}, rng_));
  std::barrier sync(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      sync.arrive_and_wait();
      results[i] = clients[i]->PutTensor(absl::StrCat("t", i), tensors[i], false).status();
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0;
  for (int i = 0; i < kThreads; ++i) {
    if (results[i].ok()) {
      ++ok;
    } else {
      EXPECT_TRUE(StatusIs(results[i], Code::kResourceExhausted, {"--memory_budget_bytes"}));
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_LE(ok, 2) << "three 3 MiB tensors cannot fit in 8 MiB";
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(static_cast<int>(list->size()), ok);
  EXPECT_EQ(UsedBytes(), ok * 3 * kMiB);
  for (const v1::TensorInfo& info : *list) {
    const int i = std::atoi(info.name().c_str() + 1);
    absl::StatusOr<client::HostTensor> back = client().GetTensor(info.name());
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(back->data == tensors[i].data) << info.name();
    EXPECT_TRUE(client().DeleteTensor(info.name()).ok());
  }
  EXPECT_EQ(UsedBytes(), 0u);
}

// ---------------------------------------------------------------------------------------------
// --max_inflight

class InflightTest : public HardeningTest {
 protected:
  static constexpr int kMaxInflight = 2;
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_inflight=", kMaxInflight)};
  }
};

// Many clients at once, each sending slow matmuls back to back: the device queue holds at most
// kMaxInflight, the others are answered RESOURCE_EXHAUSTED at once (never queued without bound,
// never hung), and every request that was accepted computes the right result.
TEST_F(InflightTest, SaturatedQueueAnswersResourceExhaustedAndServesTheRest) {
  absl::StatusOr<SlowMatmul> slow = SlowMatmul::Prepare(client(), 0.15, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  constexpr int kThreads = 12, kPerThread = 3;
  std::vector<std::unique_ptr<client::Client>> clients;
  client::ClientOptions options;
  options.timeout = absl::Seconds(60);  // a hung call fails the test rather than the suite
  for (int i = 0; i < kThreads; ++i) clients.push_back(NewClient(options));

  struct Outcome {
    absl::Status status;
    bool correct = false;
    double seconds = 0;
  };
  std::vector<Outcome> outcomes(kThreads * kPerThread);
  std::barrier sync(kThreads);
  std::vector<std::thread> threads;
  const v1::ExecuteRequest request = slow->Request();
  const auto start = Clock::now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      sync.arrive_and_wait();
      for (int k = 0; k < kPerThread; ++k) {
        Outcome& o = outcomes[t * kPerThread + k];
        const auto sent = Clock::now();
        absl::StatusOr<v1::ExecuteResponse> r = clients[t]->Execute(request);
        o.seconds = SecondsSince(sent);
        o.status = r.status();
        o.correct = r.ok() && slow->Check(*r);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = SecondsSince(start);

  int ok = 0, exhausted = 0;
  double slowest_refusal = 0;
  for (const Outcome& o : outcomes) {
    if (o.status.ok()) {
      ++ok;
      EXPECT_TRUE(o.correct);
    } else {
      ++exhausted;
      EXPECT_TRUE(StatusIs(o.status, Code::kResourceExhausted, {"--max_inflight=2"}));
      slowest_refusal = std::max(slowest_refusal, o.seconds);
    }
  }
  std::cout << "[ INFLIGHT ] " << outcomes.size() << " requests (matmul " << slow->n() << "^3, "
            << slow->seconds() << " s each): " << ok << " OK, " << exhausted
            << " RESOURCE_EXHAUSTED, slowest refusal " << slowest_refusal << " s, all done in "
            << wall << " s" << std::endl;
  EXPECT_GE(ok, kMaxInflight);
  EXPECT_GE(exhausted, 1);
  // A refusal is immediate: it never waits for the device (a slow matmul) to drain.
  EXPECT_LT(slowest_refusal, std::max(2.0, 5 * slow->seconds()));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(client().Execute(request).ok());  // free again
}

// ---------------------------------------------------------------------------------------------
// Deadlines and cancellation. The device worker runs one request at a time, so how long a small
// request waits in its queue (RequestTiming.queue_us) shows whether the worker is still busy
// with an abandoned graph.

class AbandonTest : public HardeningTest {
 protected:
  static constexpr int kNodes = 12;

  // A small request's time in the device queue.
  double QueueSecondsOfASmallRequest() {
    v1::ExecuteRequest small;
    AddInline(small, "x", F32({2}, {1.f, 2.f}));
    AddNode(small, "s", "sum", {Inline("x")});
    AddOutput(small, "s", true);
    absl::StatusOr<v1::ExecuteResponse> r = client().Execute(small);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->timing().queue_us() * 1e-6 : 1e9;
  }
};

TEST_F(AbandonTest, DeadlineMidGraphIsDeadlineExceededAndTheRestIsAbandoned) {
  absl::StatusOr<SlowMatmul> slow = SlowMatmul::Prepare(client(), 0.12, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  const v1::ExecuteRequest chain = slow->Chain(kNodes);
  // The whole graph, once, to know what abandoning it saves under the current load.
  const auto full_start = Clock::now();
  absl::StatusOr<v1::ExecuteResponse> full = client().Execute(chain);
  const double full_s = SecondsSince(full_start);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(slow->Check(*full));
  const double per_node = full_s / kNodes;
  const double exceeded_before = Requests("Execute", "DEADLINE_EXCEEDED");

  const double deadline_s = 2.5 * per_node;
  const auto start = Clock::now();
  const absl::Status s =
      client().Execute(chain, {.timeout = absl::Seconds(deadline_s)}).status();
  const double client_s = SecondsSince(start);
  EXPECT_TRUE(StatusIs(s, Code::kDeadlineExceeded)) << s;
  const double queued = QueueSecondsOfASmallRequest();
  std::cout << "[ DEADLINE ] " << kNodes << " nodes take " << full_s << " s; deadline "
            << deadline_s << " s answered after " << client_s
            << " s; a request sent then waited " << queued << " s for the device" << std::endl;
  // Not abandoned, the small request would wait for about kNodes - 2.5 more nodes.
  EXPECT_LT(queued, 0.5 * (full_s - deadline_s))
      << "the device kept running the graph after its deadline";
  // The server itself saw the deadline (not only the client).
  const auto until = Clock::now() + std::chrono::seconds(3);
  while (Requests("Execute", "DEADLINE_EXCEEDED") <= exceeded_before && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Requests("Execute", "DEADLINE_EXCEEDED"), exceeded_before + 1)
      << "opserve_requests_total{rpc=\"Execute\"} recorded the expired request as: CANCELLED "
      << Requests("Execute", "CANCELLED") << ", OK " << Requests("Execute", "OK");
  EXPECT_TRUE(Serving());
}

TEST_F(AbandonTest, CancelledExecuteIsCancelledAndGivesItsMemoryBack) {
  absl::StatusOr<SlowMatmul> slow = SlowMatmul::Prepare(client(), 0.12, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  const uint64_t baseline = UsedBytes();  // the two stored operands
  ASSERT_EQ(baseline, 2 * slow->n() * slow->n() * 4u);
  // Every node's output stays alive to the end of the request (none is read by another), and
  // an inline tensor rides along: the request holds much more than the store while it runs.
  v1::ExecuteRequest chain = slow->Chain(kNodes);
  AddInline(chain, "ballast", RandomTensor(v1::FLOAT32, {256, 1024}, rng_));
  AddNode(chain, "ballast_sum", "sum", {Inline("ballast")});
  AddOutput(chain, "ballast_sum", true);
  // The whole graph, once, to know what abandoning it saves under the current load.
  const auto full_start = Clock::now();
  absl::StatusOr<v1::ExecuteResponse> full = client().Execute(chain);
  const double full_s = SecondsSince(full_start);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(UsedBytes(), baseline) << "a finished request kept memory";

  BackgroundExecute call(stub(), chain);
  // Cancel once the request is surely on the device: it is in flight (the gauge counts it from
  // the handler on), and two and a half nodes' time later it is running its third node and
  // holds the ballast and two outputs. (The used-bytes gauge is refreshed when requests end, so
  // it cannot show the bytes of one still running.)
  for (auto until = Clock::now() + std::chrono::seconds(20);
       Clock::now() < until && !call.done();) {
    absl::StatusOr<double> inflight = Metric("opserve_inflight_requests");
    if (inflight.ok() && *inflight >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(2.5 * full_s / kNodes));
  ASSERT_FALSE(call.done()) << "the graph finished before it could be cancelled: "
                            << call.Wait().error_code() << " " << call.Wait().error_message();
  call.Cancel();
  const grpc::Status status = call.Wait();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  const double queued = QueueSecondsOfASmallRequest();
  std::cout << "[ CANCEL   ] a request sent after the cancel waited " << queued
            << " s for the device (the graph takes ~" << full_s << " s)" << std::endl;
  EXPECT_LT(queued, 0.5 * full_s) << "the device kept running the cancelled graph";
  // The gauge is refreshed as the abandoned request ends: every byte it held is back.
  EXPECT_EQ(WaitForUsedBytes(baseline, std::chrono::seconds(5)), baseline)
      << "the cancelled request's memory was not given back";
  EXPECT_GE(Requests("Execute", "CANCELLED"), 1.0);
  EXPECT_TRUE(Serving());
}

// A client that stops reading a download and cancels it, after the tensor was deleted: the
// download's reference was the last one, so its bytes must go back to the budget, and the
// used-bytes gauge must say so.
class CancelledDownloadTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", 16 * kMiB), "--chunk_bytes=65536"};
  }
};

TEST_F(CancelledDownloadTest, CancelledDownloadOfADeletedTensorGivesItsMemoryBack) {
  ASSERT_TRUE(client().PutTensor("big", RandomTensor(v1::FLOAT32, {3 * 1024 * 1024}, rng_), false).ok());
  ASSERT_EQ(UsedBytes(), 12 * kMiB);
  // A channel with a small, fixed receive window: the server can run at most one window ahead
  // of what the client reads, so the download stays open while the client does not read.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 65536);
  auto slow_reader = v1::OpServe::NewStub(grpc::CreateCustomChannel(
      server().target(), grpc::InsecureChannelCredentials(), args));
  const client::HostTensor twelve = RandomTensor(v1::FLOAT32, {3 * 1024 * 1024}, rng_);
  {
    grpc::ClientContext ctx;
    v1::GetTensorRequest req;
    req.set_name("big");
    req.set_chunk_bytes(65536);
    auto reader = slow_reader->GetTensor(&ctx, req);
    v1::GetTensorResponse msg;
    ASSERT_TRUE(reader->Read(&msg));  // the info
    ASSERT_TRUE(msg.has_info());
    ASSERT_TRUE(reader->Read(&msg));  // one chunk; then the client stops reading
    ASSERT_TRUE(client().DeleteTensor("big").ok());
    EXPECT_TRUE(client().ListTensors()->empty());
    // The open download still holds the deleted tensor's 12 MiB: 12 more do not fit in 16.
    EXPECT_TRUE(StatusIs(client().PutTensor("again", twelve, false).status(),
                         Code::kResourceExhausted, {"--memory_budget_bytes"}));
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The gauge, polled without any other call that would refresh it.
  EXPECT_EQ(WaitForUsedBytes(0, std::chrono::seconds(3)), 0u)
      << "opserve_device_memory_bytes{kind=\"used\"} still counts the deleted tensor after its "
         "download was cancelled";
  // The budget itself: the 12 MiB fit again.
  absl::Status put = absl::UnknownError("not tried");
  for (auto until = Clock::now() + std::chrono::seconds(5); Clock::now() < until;) {
    put = client().PutTensor("again", twelve, false).status();
    if (put.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(put.ok()) << put;
  EXPECT_EQ(UsedBytes(), 12 * kMiB);
  EXPECT_TRUE(Serving());
}

}  // namespace
}  // namespace opserve::hardening
