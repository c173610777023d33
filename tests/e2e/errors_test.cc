// One request per error class against one running server, in sequence: each gets its code and
// a message naming the culprit, and after each the server still answers health SERVING, its
// process is alive, and every stored tensor is as it was (list + get before and after).
//
// Malformed PutTensor streams go through the generated stub: the client library checks byte
// counts and dtypes itself and would never send them.
#include <grpcpp/client_context.h>

#include <chrono>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

constexpr uint64_t kMiB = 1 << 20;

v1::PutTensorRequest Header(const std::string& name, int dtype, const std::vector<int64_t>& shape,
                            bool overwrite = false) {
  v1::PutTensorRequest r;
  v1::PutTensorHeader* h = r.mutable_header();
  h->set_name(name);
  h->set_dtype(static_cast<v1::DType>(dtype));
  h->mutable_shape()->Add(shape.begin(), shape.end());
  h->set_overwrite(overwrite);
  return r;
}

v1::PutTensorRequest Chunk(size_t bytes) {
  v1::PutTensorRequest r;
  r.set_chunk(std::string(bytes, '\x7f'));
  return r;
}

class ErrorsTest : public OpserveTest {
 protected:
  // Limits small enough to reach from a test, ordered so each can be hit on its own:
  // message (4 MiB) < tensor (8 MiB) < budget (64 MiB).
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", 64 * kMiB),
            absl::StrCat("--max_tensor_bytes=", 8 * kMiB), "--max_graph_nodes=8",
            absl::StrCat("--max_message_bytes=", 4 * kMiB)};
  }

  void SetUp() override {
    OpserveTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {2, 3}, rng_), false).ok());
    ASSERT_TRUE(client().PutTensor("B", RandomTensor(v1::FLOAT32, {3, 4}, rng_), false).ok());
    ASSERT_TRUE(client().PutTensor("I", RandomTensor(v1::INT32, {2, 3}, rng_), false).ok());
  }

  absl::Status Exec(const v1::ExecuteRequest& req) { return client().Execute(req).status(); }

  // Sends `messages` as one PutTensor stream and returns the server's status.
  absl::Status RawPut(const std::vector<v1::PutTensorRequest>& messages) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::PutTensorResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::PutTensorRequest>> w = stub().PutTensor(&ctx, &resp);
    for (const v1::PutTensorRequest& m : messages) {
      if (!w->Write(m)) break;  // the server already finished the call; Finish says why
    }
    w->WritesDone();
    return client::ToAbslStatus(w->Finish());
  }

  struct Case {
    std::string name;
    std::function<absl::Status()> call;
    absl::StatusCode code;
    std::vector<std::string> fragments;
  };

  // Runs each case and checks the server and the store after it.
  void RunAll(const std::vector<Case>& cases) {
    RecordProperty("error_cases", std::to_string(cases.size()));
    const StoreSnapshot before = Snapshot(client());
    ASSERT_EQ(before.info.size(), 3u);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const absl::Status s = c.call();
      EXPECT_EQ(s.code(), c.code) << s;
      for (const std::string& f : c.fragments) {
        EXPECT_NE(s.message().find(f), std::string::npos)
            << "the message \"" << s.message() << "\" does not mention " << f;
      }
      ASSERT_TRUE(Serving());
      EXPECT_TRUE(SameStore(before, Snapshot(client())));
    }
  }
};

TEST_F(ErrorsTest, ExecuteErrorsEachGetTheirCodeAndTheServerKeepsServing) {
  using Code = absl::StatusCode;
  auto req = [](std::function<void(v1::ExecuteRequest&)> build) {
    v1::ExecuteRequest r;
    build(r);
    return r;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, v1::ExecuteRequest r, Code code,
                 std::vector<std::string> fragments) {
    cases.push_back({std::move(name), [this, r] { return Exec(r); }, code, std::move(fragments)});
  };

  add("empty graph", v1::ExecuteRequest(), Code::kInvalidArgument, {"no nodes"});
  add("unknown op", req([](auto& r) { AddNode(r, "n1", "softmax", {Stored("A")}); }),
      Code::kInvalidArgument, {"'n1'", "'softmax'", "matmul"});
  add("unknown attribute", req([](auto& r) {
        (*AddNode(r, "n1", "sum", {Stored("A")})->mutable_attrs())["axis"].set_i(1);
      }),
      Code::kInvalidArgument, {"'n1'", "'axis'"});
  add("wrong arity", req([](auto& r) { AddNode(r, "mm", "matmul", {Stored("A")}); }),
      Code::kInvalidArgument, {"'mm'", "expected 2", "got 1"});
  add("dtype mismatch", req([](auto& r) { AddNode(r, "mm", "matmul", {Stored("I"), Stored("I")}); }),
      Code::kInvalidArgument, {"'mm'", "FLOAT32", "INT32[2,3]"});
  add("dtype mismatch between operands", req([](auto& r) {
        AddInline(r, "b16", v1::BFLOAT16, {3, 4});
        AddNode(r, "mm", "matmul", {Stored("A"), Inline("b16")});
      }),
      Code::kInvalidArgument, {"'mm'", "FLOAT32", "BFLOAT16[3,4]"});
  add("shape mismatch", req([](auto& r) {
        AddNode(r, "mm", "matmul", {Stored("A"), Stored("A")});
      }),
      Code::kInvalidArgument, {"'mm'", "FLOAT32[2,3]", "= 3"});
  add("inline byte count too few", req([](auto& r) {
        AddInline(r, "x", v1::FLOAT32, {2, 2}, 15);
        AddNode(r, "s", "sum", {Inline("x")});
      }),
      Code::kInvalidArgument, {"'x'", "15 bytes", "expected 16"});
  add("inline byte count too many", req([](auto& r) {
        AddInline(r, "x", v1::FLOAT32, {2, 2}, 17);
        AddNode(r, "s", "sum", {Inline("x")});
      }),
      Code::kInvalidArgument, {"'x'", "17 bytes", "expected 16"});
  add("inline bad dtype", req([](auto& r) {
        AddInline(r, "x", v1::DTYPE_UNSPECIFIED, {2}, 8);
        AddNode(r, "s", "sum", {Inline("x")});
      }),
      Code::kInvalidArgument, {"'x'", "dtype", "got DTYPE_UNSPECIFIED (0)"});
  add("inline dtype out of range", req([](auto& r) {
        AddInline(r, "x", static_cast<v1::DType>(99), {2}, 8);
        AddNode(r, "s", "sum", {Inline("x")});
      }),
      Code::kInvalidArgument, {"'x'", "dtype", "got 99"});
  add("inline rank 5", req([](auto& r) {
        AddInline(r, "x", v1::FLOAT32, {1, 1, 1, 1, 2});
        AddNode(r, "s", "sum", {Inline("x")});
      }),
      Code::kInvalidArgument, {"'x'", "rank"});
  add("duplicate node id", req([](auto& r) {
        AddNode(r, "n", "sum", {Stored("A")});
        AddNode(r, "n", "sum", {Stored("B")});
      }),
      Code::kInvalidArgument, {"duplicate", "'n'"});
  add("cycle", req([](auto& r) {
        AddNode(r, "a", "transpose", {Node("b")});
        AddNode(r, "b", "transpose", {Node("a")});
      }),
      Code::kInvalidArgument, {"cycle", "'a'", "'b'"});
  add("self-loop", req([](auto& r) { AddNode(r, "a", "transpose", {Node("a")}); }),
      Code::kInvalidArgument, {"cycle", "'a'"});
  add("dangling node reference",
      req([](auto& r) { AddNode(r, "t", "transpose", {Node("ghost")}); }), Code::kInvalidArgument,
      {"'t'", "'ghost'"});
  add("dangling inline reference",
      req([](auto& r) { AddNode(r, "t", "transpose", {Inline("nope")}); }), Code::kInvalidArgument,
      {"'t'", "'nope'"});
  add("dangling output reference", req([](auto& r) {
        AddNode(r, "s", "sum", {Stored("A")});
        AddOutput(r, "ghost", true);
      }),
      Code::kInvalidArgument, {"'ghost'"});
  add("missing stored tensor", req([](auto& r) { AddNode(r, "s", "sum", {Stored("missing")}); }),
      Code::kNotFound, {"'s'", "'missing'"});
  add("store_as an existing name", req([](auto& r) {
        AddNode(r, "t", "transpose", {Stored("A")});
        AddOutput(r, "t", false, "B");
      }),
      Code::kAlreadyExists, {"'B'"});
  add("graph over --max_graph_nodes", req([](auto& r) {
        for (int i = 0; i < 9; ++i) AddNode(r, absl::StrCat("s", i), "sum", {Stored("A")});
      }),
      Code::kResourceExhausted, {"9 nodes", "limit of 8"});
  // [2048,1] x [1,1025] is 16 KiB in and 8,396,800 bytes out, over the 8 MiB tensor limit.
  add("intermediate over --max_tensor_bytes", req([](auto& r) {
        AddInline(r, "col", v1::FLOAT32, {2048, 1});
        AddInline(r, "row", v1::FLOAT32, {1, 1025});
        AddNode(r, "outer", "matmul", {Inline("col"), Inline("row")});
        AddNode(r, "s", "sum", {Node("outer")});
      }),
      Code::kResourceExhausted, {"'outer'", "8396800", std::to_string(8 * kMiB)});
  // [1024,1] x [1,1025] returns 4,198,400 bytes, over the 4 MiB message limit.
  add("returned outputs over --max_message_bytes", req([](auto& r) {
        AddInline(r, "col", v1::FLOAT32, {1024, 1});
        AddInline(r, "row", v1::FLOAT32, {1, 1025});
        AddNode(r, "outer", "matmul", {Inline("col"), Inline("row")});
        AddOutput(r, "outer", true);
      }),
      Code::kResourceExhausted, {"4198400", std::to_string(4 * kMiB)});
  add("request message over --max_message_bytes", req([](auto& r) {
        AddInline(r, "x", v1::FLOAT32, {5 * 1024 * 256});
        AddNode(r, "s", "sum", {Inline("x")});
      }),
      Code::kResourceExhausted, {});
  add("unknown algorithm", req([](auto& r) {
        AddNode(r, "mm", "matmul", {Stored("A"), Stored("B")}, "warp9");
      }),
      Code::kInvalidArgument, {"'mm'", "'warp9'", "has no algorithm", "auto"});
  RunAll(cases);
}

TEST_F(ErrorsTest, TransferErrorsEachGetTheirCodeAndTheServerKeepsServing) {
  using Code = absl::StatusCode;
  std::vector<Case> cases = {
      {"put: too few bytes",
       [&] {
         return RawPut({Header("p", v1::FLOAT32, {4}), Chunk(12)});
       },
       Code::kInvalidArgument,
       {"'p'", "12 bytes", "expected 16"}},
      {"put: no data at all",
       [&] { return RawPut({Header("p", v1::FLOAT32, {4})}); },
       Code::kInvalidArgument,
       {"'p'", "0 bytes", "expected 16"}},
      {"put: too many bytes",
       [&] {
         return RawPut({Header("p", v1::FLOAT32, {4}), Chunk(16), Chunk(4)});
       },
       Code::kInvalidArgument,
       {"'p'", "16 bytes", "20"}},
      {"put: too many bytes in one chunk",
       [&] {
         return RawPut({Header("p", v1::INT64, {2}), Chunk(17)});
       },
       Code::kInvalidArgument,
       {"'p'", "16 bytes"}},
      {"put: chunk before header",
       [&] {
         return RawPut({Chunk(16), Header("p", v1::FLOAT32, {4})});
       },
       Code::kInvalidArgument,
       {"header"}},
      {"put: empty stream", [&] { return RawPut({}); }, Code::kInvalidArgument, {"header"}},
      {"put: second header",
       [&] {
         return RawPut({Header("p", v1::FLOAT32, {1}), Header("q", v1::FLOAT32, {1}), Chunk(4)});
       },
       Code::kInvalidArgument,
       {"tensor 'p'", "second header", "'q'"}},
      {"put: dtype unspecified",
       [&] {
         return RawPut({Header("p", v1::DTYPE_UNSPECIFIED, {4}), Chunk(16)});
       },
       Code::kInvalidArgument,
       {"'p'", "dtype", "got DTYPE_UNSPECIFIED (0)"}},
      {"put: dtype out of range",
       [&] {
         return RawPut({Header("p", 99, {4}), Chunk(16)});
       },
       Code::kInvalidArgument,
       {"'p'", "dtype", "got 99"}},
      {"put: rank 5",
       [&] {
         return RawPut({Header("p", v1::FLOAT32, {1, 1, 1, 1, 1}), Chunk(4)});
       },
       Code::kInvalidArgument,
       {"'p'", "rank", "5"}},
      {"put: a zero dimension hiding a negative one",
       [&] {
         return RawPut({Header("p", v1::FLOAT32, {0, -3})});
       },
       Code::kInvalidArgument,
       {"'p'", "got -3"}},
      {"put: negative dimension",
       [&] { return RawPut({Header("p", v1::FLOAT32, {-4})}); },
       Code::kInvalidArgument,
       {"'p'", "got -4"}},
      {"put: shape whose bytes overflow 64 bits",
       [&] {
         return RawPut({Header("p", v1::FLOAT32, {int64_t{1} << 32, int64_t{1} << 32}), Chunk(4)});
       },
       Code::kResourceExhausted,
       {"'p'"}},
      {"put: bad name",
       [&] {
         return RawPut({Header("a b", v1::FLOAT32, {1}), Chunk(4)});
       },
       Code::kInvalidArgument,
       {"a b"}},
      {"put: over --max_tensor_bytes",
       [&] {
         return RawPut({Header("huge", v1::FLOAT32, {2 * 1024 * 1024 + 1}), Chunk(4)});
       },
       Code::kResourceExhausted,
       {"'huge'", "8388612", std::to_string(8 * kMiB)}},
      {"put: overwrite without the flag",
       [&] {
         return client().PutTensor("A", RandomTensor(v1::FLOAT32, {2, 3}, rng_), false).status();
       },
       Code::kAlreadyExists,
       {"'A'"}},
      {"put: overwrite with the flag but too few bytes",
       [&] {
         return RawPut({Header("A", v1::FLOAT32, {2, 3}, true), Chunk(20)});
       },
       Code::kInvalidArgument,
       {"'A'", "20 bytes", "expected 24"}},
      {"get: missing",
       [&] { return client().GetTensor("nobody").status(); },
       Code::kNotFound,
       {"'nobody'"}},
      {"delete: missing",
       [&] { return client().DeleteTensor("nobody").status(); },
       Code::kNotFound,
       {"'nobody'"}},
  };
  RunAll(cases);
}

// An inline tensor over --max_tensor_bytes needs a message limit above the tensor limit.
class TensorLimitTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_tensor_bytes=", kMiB)};
  }
};

TEST_F(TensorLimitTest, InlineAndStoredTensorsOverTheLimit) {
  v1::ExecuteRequest r;
  AddInline(r, "big", v1::FLOAT32, {262145});  // 1 MiB + 4 bytes
  AddNode(r, "s", "sum", {Inline("big")});
  AddOutput(r, "s", true);
  EXPECT_TRUE(StatusIs(client().Execute(r).status(), absl::StatusCode::kResourceExhausted,
                       {"'big'", "1048580", "1048576"}));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(
      StatusIs(client().PutTensor("big", RandomTensor(v1::FLOAT32, {262145}, rng_), false).status(),
               absl::StatusCode::kResourceExhausted, {"'big'", "1048580", "1048576"}));
  EXPECT_TRUE(Serving());
  // At the limit is fine.
  EXPECT_TRUE(client().PutTensor("ok", RandomTensor(v1::FLOAT32, {262144}, rng_), false).ok());
  EXPECT_EQ(client().ListTensors()->size(), 1u);
}

TEST_F(ErrorsTest, StoreAsExistingNameWithOverwrite) {
  v1::ExecuteRequest r;
  AddNode(r, "t", "transpose", {Stored("A")});
  AddOutput(r, "t", false, "B", /*overwrite=*/true);
  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  absl::StatusOr<client::HostTensor> a = client().GetTensor("A");
  absl::StatusOr<client::HostTensor> b = client().GetTensor("B");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->shape, (std::vector<int64_t>{3, 2}));
  const std::vector<float> av = Floats(a->data), bv = Floats(b->data);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(std::memcmp(&bv[j * 2 + i], &av[i * 3 + j], 4), 0) << i << "," << j;
    }
  }
}

// The memory budget, on uploads and on Execute's intermediates, and a request that fails after
// some of its nodes ran: nothing it would have stored or overwritten changes.
class BudgetTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", 8 * kMiB)};
  }
};

TEST_F(BudgetTest, OverBudgetFailsAndLeavesTheStoreAsItWas) {
  SKIP_UNLESS_CPU_BACKEND("budget sized to the reference kernels");
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {1024, 1024}, rng_), false).ok());
  ASSERT_TRUE(client().PutTensor("B", RandomTensor(v1::FLOAT32, {768, 1024}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());  // 7 of 8 MiB in use

  // An upload that does not fit.
  EXPECT_TRUE(StatusIs(
      client().PutTensor("C", RandomTensor(v1::FLOAT32, {512, 1024}, rng_), false).status(),
      absl::StatusCode::kResourceExhausted, {"'C'", "budget"}));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));

  // An overwrite that does not fit while the old tensor still holds its bytes.
  EXPECT_TRUE(
      StatusIs(client().PutTensor("A", RandomTensor(v1::FLOAT32, {512, 1024}, rng_), true).status(),
               absl::StatusCode::kResourceExhausted, {"'A'"}));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));

  // A graph whose first node runs and whose second cannot get memory: neither the overwrite of
  // A nor the new name may happen.
  v1::ExecuteRequest r;
  AddNode(r, "s", "sum", {Stored("A")});
  AddNode(r, "t", "transpose", {Stored("A")});  // 4 MiB more: over the budget
  AddOutput(r, "s", true, "A", /*overwrite=*/true);
  AddOutput(r, "s", false, "s_out");
  AddOutput(r, "t", false, "t_out");
  EXPECT_TRUE(StatusIs(client().Execute(r).status(), absl::StatusCode::kResourceExhausted,
                       {"'t'", "budget"}));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));

  // Freeing B makes exactly enough room: 4 MiB for A and 4 MiB for its transpose.
  ASSERT_TRUE(client().DeleteTensor("B").ok());
  v1::ExecuteRequest fits;
  AddNode(fits, "t", "transpose", {Stored("A")});
  AddOutput(fits, "t", false, "t_out");
  absl::StatusOr<v1::ExecuteResponse> ok = client().Execute(fits);
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(Serving());
}

// Deleting or replacing a tensor gives its bytes back to the budget.
TEST_F(BudgetTest, DeleteAndOverwriteReturnTheirBytes) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    ASSERT_TRUE(
        client().PutTensor("six", RandomTensor(v1::FLOAT32, {6 * 1024 * 256}, rng_), false).ok());
    ASSERT_TRUE(client().DeleteTensor("six").ok());
  }
  // 4 MiB, replaced by 3 MiB (both held during the upload: 7 of 8), then 4 MiB more fits only
  // if the first 4 MiB went back.
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {1024, 1024}, rng_), false).ok());
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {768, 1024}, rng_), true).ok());
  EXPECT_TRUE(client().PutTensor("B", RandomTensor(v1::FLOAT32, {1024, 1024}, rng_), false).ok());
}

// An intermediate's memory goes back after its last reader: a chain of five 2 MiB transposes
// peaks at three live buffers (6 MiB) and fits an 8 MiB budget only if each is freed in time.
TEST_F(BudgetTest, IntermediatesAreFreedAfterTheirLastReader) {
  client::HostTensor a = RandomTensor(v1::FLOAT32, {512, 1024}, rng_);
  ASSERT_TRUE(client().PutTensor("A", a, false).ok());
  v1::ExecuteRequest r;
  AddNode(r, "t1", "transpose", {Stored("A")});
  for (int i = 2; i <= 5; ++i) {
    AddNode(r, absl::StrCat("t", i), "transpose", {Node(absl::StrCat("t", i - 1))});
  }
  AddNode(r, "s", "sum", {Node("t5")});
  AddOutput(r, "s", true);
  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->nodes_size(), 6);
  EXPECT_TRUE(Serving());
  // And nothing leaked: the same request runs again.
  EXPECT_TRUE(client().Execute(r).ok());
}

// A kernel that fails part-way through a graph (the server's test-only fault hook): the request
// gets the error naming the node, nothing it would have stored or overwritten changes, and the
// CPU backend goes on serving.
class KernelFaultTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
#if OPSERVE_TEST_HOOKS
    return {"--test_fail_algorithm=transpose/reference"};
#else
    return {};
#endif
  }
};

TEST_F(KernelFaultTest, FailedKernelLeavesTheStoreAsItWas) {
  SKIP_UNLESS_CPU_BACKEND("fails the reference row");
#if !OPSERVE_TEST_HOOKS
  GTEST_SKIP() << "opserve was built without OPSERVE_TEST_HOOKS";
#endif
  ASSERT_TRUE(client().PutTensor("A", RandomTensor(v1::FLOAT32, {3, 5}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  v1::ExecuteRequest r;
  AddNode(r, "s", "sum", {Stored("A")});        // runs
  AddNode(r, "t", "transpose", {Stored("A")});  // fails
  AddOutput(r, "s", true, "A", /*overwrite=*/true);
  AddOutput(r, "s", false, "s_out");
  AddOutput(r, "t", false, "t_out");
  absl::Status s = client().Execute(r).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'t'"), std::string::npos) << s;
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  // Other ops still run.
  v1::ExecuteRequest ok;
  AddNode(ok, "s", "sum", {Stored("A")});
  AddOutput(ok, "s", true);
  EXPECT_TRUE(client().Execute(ok).ok());
}

class MessageLimitTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_message_bytes=", 4 * kMiB)};
  }
};

// Returned outputs that pass the plan's byte check (exactly the limit) but whose response, with
// its framing and per-node report, is larger than the server may send. Either the request
// succeeds, or it fails and, like every failed request, stores nothing.
TEST_F(MessageLimitTest, ResponseAtTheLimitEitherArrivesOrStoresNothing) {
  v1::ExecuteRequest r;
  AddInline(r, "col", v1::FLOAT32, {1024, 1});
  AddInline(r, "row", v1::FLOAT32, {1, 1024});
  AddNode(r, "outer", "matmul", {Inline("col"), Inline("row")});
  AddOutput(r, "outer", true, "kept");  // 4,194,304 bytes returned, and stored
  absl::StatusOr<v1::ExecuteResponse> resp = client().Execute(r);
  EXPECT_TRUE(Serving());
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  if (resp.ok()) {
    EXPECT_EQ(resp->outputs(0).tensor().data().size(), 4 * kMiB);
    EXPECT_EQ(list->size(), 1u);
  } else {
    EXPECT_TRUE(StatusIs(resp.status(), absl::StatusCode::kResourceExhausted));
    EXPECT_TRUE(list->empty()) << "the request failed (" << resp.status() << ") but stored '"
                               << (*list)[0].name() << "'";
  }
}

}  // namespace
}  // namespace opserve::e2e
