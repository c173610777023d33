// Faults: a client that dies mid-upload, SIGTERM under load, and a failing kernel.
#include <grpcpp/client_context.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/hardening/hardening_support.h"

namespace opserve::hardening {
namespace {

using Code = absl::StatusCode;

// ---------------------------------------------------------------------------------------------
// A client process killed in the middle of an upload (the kernel closes its socket, as with a
// crash or a dropped connection): nothing of the upload is stored and its reservation goes back.

class DisconnectTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", 16 * kMiB)};
  }
};

TEST_F(DisconnectTest, KilledClientMidUploadLeavesNoTensorAndNoReservation) {
  ASSERT_TRUE(client().PutTensor("keep", RandomTensor(v1::FLOAT32, {256 * 1024}, rng_), false).ok());
  const StoreSnapshot before = Snapshot(client());
  const uint64_t baseline = UsedBytes();
  ASSERT_EQ(baseline, 1 * kMiB);

  // 6 MiB announced, 3 MiB sent.
  auto helper = Child::Spawn({UploadHelperBinary(), server().target(), "partial",
                              std::to_string(6 * kMiB / 4), std::to_string(3 * kMiB)});
  ASSERT_TRUE(helper.ok()) << helper.status();
  absl::StatusOr<std::string> sent = (*helper)->WaitForLine("SENT", std::chrono::seconds(20));
  ASSERT_TRUE(sent.ok()) << sent.status();

  // While the upload is open it holds its 6 MiB: 10 MiB more does not fit in 16 (1 stored).
  const client::HostTensor ten = RandomTensor(v1::FLOAT32, {10 * 1024 * 256}, rng_);
  EXPECT_TRUE(StatusIs(client().PutTensor("probe", ten, false).status(),
                       Code::kResourceExhausted, {"--memory_budget_bytes"}));
  // A named list: a range-for over `*client().ListTensors()` would walk a destroyed temporary.
  const auto listed = client().ListTensors();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_FALSE(listed->empty());
  for (const v1::TensorInfo& info : *listed) EXPECT_NE(info.name(), "partial");

  (*helper)->Kill();

  // The server notices the dead connection asynchronously; within a few seconds the 6 MiB are
  // back and the 10 MiB fit.
  absl::Status probe = absl::UnknownError("not tried");
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    probe = client().PutTensor("probe", ten, false).status();
    if (probe.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(probe.ok()) << "the dead upload's reservation was not given back: " << probe;
  ASSERT_TRUE(client().DeleteTensor("probe").ok());
  EXPECT_TRUE(SameStore(before, Snapshot(client()))) << "the dead upload left something behind";
  EXPECT_EQ(UsedBytes(), baseline);
  EXPECT_EQ(client().GetTensor("partial").status().code(), Code::kNotFound);
  EXPECT_TRUE(Serving());
  // The name is free for a real upload.
  EXPECT_TRUE(client().PutTensor("partial", RandomTensor(v1::FLOAT32, {16}, rng_), false).ok());
}

// Every byte sent, but the stream never half-closed: the client did not finish the upload (it
// might have sent more, or meant to), so nothing is committed.
TEST_F(DisconnectTest, KilledClientWithEveryByteSentButNoHalfCloseStoresNothing) {
  for (int i = 0; i < 3; ++i) {
    const std::string name = absl::StrCat("unfinished", i);
    auto helper = Child::Spawn({UploadHelperBinary(), server().target(), name,
                                std::to_string(kMiB / 4), std::to_string(kMiB)});
    ASSERT_TRUE(helper.ok()) << helper.status();
    absl::StatusOr<std::string> sent = (*helper)->WaitForLine("SENT", std::chrono::seconds(20));
    ASSERT_TRUE(sent.ok()) << sent.status();
    (*helper)->Kill();
  }
  // The whole 16 MiB budget fits again once the server has seen the three connections die: by
  // then every upload has ended, committed or not.
  const client::HostTensor all = RandomTensor(v1::FLOAT32, {4 * 1024 * 1024}, rng_);
  absl::Status put = absl::UnknownError("not tried");
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    put = client().PutTensor("all", all, false).status();
    if (put.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(put.ok()) << put;
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  for (const v1::TensorInfo& info : *list) {
    EXPECT_EQ(info.name(), "all") << "an unfinished upload was committed";
  }
  EXPECT_TRUE(Serving());
}

// ---------------------------------------------------------------------------------------------
// SIGTERM under load.
//
// The store lives in memory, so every tensor goes when the process exits; "no acknowledged put
// is lost before exit" is checked as:
//  - every put acknowledged before the signal was read back, bytes compared, by the thread that
//    made it (right after its acknowledgement); a read-back may fail only as refused by the
//    shutdown (new calls are refused while draining), never with NOT_FOUND or other bytes;
//  - an upload in flight at the signal (header and half its bytes sent before, the rest after)
//    is drained to OK; the server acknowledges a put only after committing it to the store
//    (PutAssembly::Commit precedes Finish), so OK means stored until exit;
//  - an Execute running at the signal completes with the right result;
//  - a call that fails was refused, never accepted and then dropped: UNAVAILABLE, or the
//    "CANCELLED" that gRPC core gives a call it had received but not yet handed to a handler
//    when the shutdown began (grpc/grpc#41785; with this 2-core machine saturated by the
//    matmul, such a call can be one sent up to ~0.2 s before the signal: counted and printed);
//    no call hangs;
//  - the process exits 0.

struct CallRecord {
  std::string what;
  Clock::time_point start, end;
  absl::Status status;
};

// Joins threads on every way out of a test, failed assertions included.
struct JoinAll {
  std::atomic<bool>& stop;
  std::vector<std::thread>& threads;
  ~JoinAll() {
    stop = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

TEST_F(HardeningTest, SigtermUnderLoadDrainsInFlightCallsLosesNoAcknowledgedPutAndExitsZero) {
  absl::StatusOr<SlowMatmul> slow = SlowMatmul::Prepare(client(), 0.25, rng_);
  ASSERT_TRUE(slow.ok()) << slow.status();

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<CallRecord> failures;  // every failed call of the load threads
  struct Put {
    Clock::time_point acked, verify_start;
    absl::Status verify;
    bool same_bytes = false;
  };
  std::vector<Put> puts;
  int executes_ok = 0;
  auto record_failure = [&](const std::string& what, Clock::time_point start,
                            const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back({what, start, Clock::now(), s});
  };

  std::vector<std::thread> threads;
  JoinAll join_all{stop, threads};
  constexpr int kWriters = 3;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w * 7919 + 1);
      auto c = NewClient();
      for (int k = 0; !stop; ++k) {
        const std::string name = absl::StrCat("w", w, "_", k);
        const client::HostTensor t = RandomTensor(v1::INT32, {64 * 1024}, rng);
        const auto start = Clock::now();
        absl::Status s = c->PutTensor(name, t, false).status();
        if (!s.ok()) {
          record_failure("PutTensor", start, s);
          return;
        }
        Put p;
        p.acked = Clock::now();
        p.verify_start = Clock::now();
        absl::StatusOr<client::HostTensor> back = c->GetTensor(name);
        p.verify = back.status();
        p.same_bytes = back.ok() && back->data == t.data;
        {
          std::lock_guard<std::mutex> lock(mu);
          puts.push_back(p);
        }
        if (!back.ok()) {
          record_failure("GetTensor", p.verify_start, back.status());
          return;
        }
      }
    });
  }
  threads.emplace_back([&] {
    auto c = NewClient();
    v1::ExecuteRequest r;
    AddInline(r, "x", F32({2, 2}, {1.f, 2.f, 3.f, 4.f}));
    AddNode(r, "t", "transpose", {Inline("x")});
    AddNode(r, "s", "sum", {Node("t")});
    AddOutput(r, "s", true);
    while (!stop) {
      const auto start = Clock::now();
      absl::StatusOr<v1::ExecuteResponse> resp = c->Execute(r);
      if (!resp.ok()) {
        record_failure("Execute", start, resp.status());
        return;
      }
      EXPECT_EQ(Floats(resp->outputs(0).tensor().data()), std::vector<float>{10.f});
      std::lock_guard<std::mutex> lock(mu);
      ++executes_ok;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // the load runs

  // A slow Execute (matmul nodes) and a half-sent upload, both in flight at the signal. Should
  // the Execute finish too soon (the machine got faster than calibrated), a longer one goes.
  int busy_nodes = 6;
  absl::StatusOr<v1::ExecuteResponse> busy_result = absl::UnknownError("not run");
  std::atomic<bool> busy_done{false};
  auto start_busy = [&] {
    busy_done = false;
    threads.emplace_back([&, nodes = busy_nodes] {
      busy_result = client().Execute(slow->Chain(nodes));
      busy_done = true;
    });
  };
  start_busy();
  grpc::ClientContext put_ctx;
  put_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::PutTensorResponse put_resp;
  auto upload = stub().PutTensor(&put_ctx, &put_resp);
  const client::HostTensor drained = RandomTensor(v1::FLOAT32, {512 * 1024}, rng_);  // 2 MiB
  v1::PutTensorRequest msg;
  msg.mutable_header()->set_name("drained");
  msg.mutable_header()->set_dtype(v1::FLOAT32);
  msg.mutable_header()->add_shape(512 * 1024);
  ASSERT_TRUE(upload->Write(msg));
  msg.set_chunk(drained.data.substr(0, kMiB));
  ASSERT_TRUE(upload->Write(msg));
  // The upload's header has reached the server once a call on the same connection has made a
  // round trip after it. (The busy Execute runs on another channel: it is checked below.)
  {
    grpc::ClientContext ctx;
    v1::ListTensorsResponse list;
    ASSERT_TRUE(stub().ListTensors(&ctx, v1::ListTensorsRequest(), &list).ok());
  }
  // The busy Execute is in a handler, which the drain waits for, once the in-flight gauge reads
  // 2: it, and the small Execute queued behind it on the device worker (the only two Execute
  // sources now). Before that, gRPC may still hold it unhandled, and a shutdown refuses such a
  // call instead (see above): a different case, which this check keeps out of this test.
  auto busy_handled = [&] {
    for (const auto until = Clock::now() + std::chrono::seconds(30); Clock::now() < until;) {
      if (busy_done.load()) return false;
      absl::StatusOr<double> inflight = Metric("opserve_inflight_requests");
      if (inflight.ok() && *inflight >= 2) return !busy_done.load();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  bool handled = busy_handled();
  for (int retry = 0; retry < 2 && !handled && busy_done.load(); ++retry) {
    busy_nodes *= 4;  // it finished before it was seen running: a longer one
    start_busy();
    handled = busy_handled();
  }
  const bool busy_in_flight = handled && !busy_done.load();
  ASSERT_TRUE(handled) << "the slow Execute was not seen running in the server";

  server().Signal(SIGTERM);
  const auto signalled = Clock::now();

  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  msg.set_chunk(drained.data.substr(kMiB));
  const bool rest_written = upload->Write(msg);
  const bool closed = upload->WritesDone();
  const grpc::Status upload_status = upload->Finish();

  absl::StatusOr<int> exit_status = server().WaitForExit(std::chrono::seconds(40));
  stop = true;
  for (auto& t : threads) t.join();

  // The in-flight upload was drained, not cut.
  EXPECT_TRUE(rest_written && closed);
  EXPECT_TRUE(upload_status.ok()) << "the upload in flight at SIGTERM: "
                                  << upload_status.error_code() << " "
                                  << upload_status.error_message();
  EXPECT_EQ(put_resp.info().bytes(), 2 * kMiB);
  // The Execute in flight completed, correctly.
  EXPECT_TRUE(busy_in_flight) << "the slow Execute finished before the signal";
  ASSERT_TRUE(busy_result.ok()) << "the Execute in flight at SIGTERM (" << slow->n() << "^2 matmuls, "
                                << busy_nodes << " nodes): " << busy_result.status();
  EXPECT_TRUE(slow->Check(*busy_result));

  auto ms = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - signalled).count();
  };
  // Refused, never accepted: UNAVAILABLE (connection refused, GOAWAY), or gRPC core's
  // "CANCELLED" for a call it had not yet handed to a handler when the shutdown began.
  auto refused = [](const absl::Status& s) {
    return s.code() == Code::kUnavailable ||
           (s.code() == Code::kCancelled && s.message() == "CANCELLED");
  };
  int cancelled_unhandled_before_signal = 0;
  for (const CallRecord& f : failures) {
    std::cout << "[ SIGTERM  ] " << f.what << " sent at " << ms(f.start) << " ms, failed at "
              << ms(f.end) << " ms (relative to the signal): " << f.status << std::endl;
    EXPECT_TRUE(refused(f.status)) << f.what << ": " << f.status;
    EXPECT_GT(f.end, signalled) << f.what << " failed before the signal: " << f.status;
    if (f.start < signalled && f.status.code() == Code::kCancelled) ++cancelled_unhandled_before_signal;
  }
  // Every acknowledged put read back intact, or its read-back refused after the signal.
  int acked_before = 0, verified = 0, refused_after = 0;
  for (const Put& p : puts) {
    if (p.acked < signalled) ++acked_before;
    if (p.verify.ok()) {
      EXPECT_TRUE(p.same_bytes) << "a put read back different bytes";
      ++verified;
      continue;
    }
    EXPECT_NE(p.verify.code(), Code::kNotFound) << "an acknowledged put was not found";
    EXPECT_TRUE(refused(p.verify)) << p.verify;
    ++refused_after;
  }
  std::cout << "[ SIGTERM  ] " << puts.size() << " puts acknowledged (" << acked_before
            << " before the signal), " << verified << " read back intact, " << refused_after
            << " read-backs refused during the drain; " << executes_ok << " small Executes OK; "
            << failures.size() << " calls refused (" << cancelled_unhandled_before_signal
            << " of them sent before the signal but not yet handed to a handler); the 2 MiB "
               "upload and the "
            << busy_nodes << "-node Execute in flight were drained" << std::endl;
  EXPECT_GT(acked_before, 0);
  EXPECT_EQ(verified + refused_after, static_cast<int>(puts.size()));

  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  ASSERT_TRUE(WIFEXITED(*exit_status)) << "killed by signal "
                                       << (WIFSIGNALED(*exit_status) ? WTERMSIG(*exit_status) : 0);
  EXPECT_EQ(WEXITSTATUS(*exit_status), 0);
  const std::string output = server().Output();
  EXPECT_NE(output.find("draining"), std::string::npos);
  EXPECT_NE(output.find("opserve: stopped"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// A failing kernel (the test-only --test_fail_algorithm hook) fails its own request, with a
// status naming the node, while requests running other kernels at the same time succeed and
// health stays SERVING.

class FailingKernelTest : public HardeningTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
#if OPSERVE_TEST_HOOKS
    return {"--test_fail_algorithm=sum/reference"};
#else
    return {};
#endif
  }
};

TEST_F(FailingKernelTest, FailsItsOwnRequestWhileOthersSucceedAndHealthStaysServing) {
#if !OPSERVE_TEST_HOOKS
  GTEST_SKIP() << "opserve was built without OPSERVE_TEST_HOOKS";
#endif
  constexpr int64_t kRows = 96, kCols = 80;
  std::vector<float> a(kRows * kCols);
  std::uniform_int_distribution<int> d(-100, 100);
  for (float& x : a) x = static_cast<float>(d(rng_));
  ASSERT_TRUE(client().PutTensor("A", F32({kRows, kCols}, a), false).ok());
  std::vector<float> row_sums(kRows, 0.f);  // small integers: exact in float
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kCols; ++j) row_sums[i] += a[i * kCols + j];
  }

  v1::ExecuteRequest failing;  // a transpose that runs, then the faulty sum
  AddNode(failing, "t", "transpose", {Stored("A")});
  AddNode(failing, "the_sum", "sum", {Node("t")});
  AddOutput(failing, "the_sum", true, "should_not_exist");
  AddOutput(failing, "t", false, "nor_this");
  v1::ExecuteRequest good;
  AddNode(good, "r", "row_sum", {Stored("A")});
  AddNode(good, "t", "transpose", {Stored("A")});
  AddNode(good, "mm", "matmul", {Stored("A"), Node("t")});
  AddOutput(good, "r", true);
  AddOutput(good, "t", true);

  constexpr int kRounds = 25;
  std::atomic<int> failed_right{0}, good_right{0}, health_checks{0}, health_bad{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> problems;
  auto problem = [&](std::string p) {
    std::lock_guard<std::mutex> lock(mu);
    problems.push_back(std::move(p));
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      auto c = NewClient();
      for (int k = 0; k < kRounds; ++k) {
        absl::Status s = c->Execute(failing).status();
        if (StatusIs(s, Code::kInternal, {"'the_sum'", "sum/reference"})) {
          ++failed_right;
        } else {
          problem(absl::StrCat("faulty request: ", s.ToString()));
        }
      }
    });
    threads.emplace_back([&] {
      auto c = NewClient();
      for (int k = 0; k < kRounds; ++k) {
        absl::StatusOr<v1::ExecuteResponse> r = c->Execute(good);
        if (!r.ok()) {
          problem(absl::StrCat("good request: ", r.status().ToString()));
          continue;
        }
        const std::vector<float> sums = Floats(r->outputs(0).tensor().data());
        const std::vector<float> t = Floats(r->outputs(1).tensor().data());
        bool right = sums == row_sums && t.size() == a.size();
        for (int64_t i = 0; right && i < kRows; ++i) {
          for (int64_t j = 0; j < kCols; ++j) right &= t[j * kRows + i] == a[i * kCols + j];
        }
        if (right) {
          ++good_right;
        } else {
          problem("good request: wrong result");
        }
      }
    });
  }
  std::thread health([&] {
    auto c = NewClient();
    while (!stop) {
      absl::StatusOr<bool> serving = c->HealthServing();
      ++health_checks;
      if (!serving.ok() || !*serving) ++health_bad;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  health.join();

  for (const std::string& p : problems) ADD_FAILURE() << p;
  EXPECT_EQ(failed_right, 2 * kRounds);
  EXPECT_EQ(good_right, 2 * kRounds);
  EXPECT_GT(health_checks, 0);
  EXPECT_EQ(health_bad, 0) << "health left SERVING during kernel failures";
  std::cout << "[ FAULT    ] " << failed_right << " faulty requests failed naming their node, "
            << good_right << " concurrent others correct, " << health_checks
            << " health checks SERVING" << std::endl;
  EXPECT_TRUE(Serving());
  // The failed requests stored nothing.
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name(), "A");
  EXPECT_GE(Requests("Execute", "INTERNAL"), 2.0 * kRounds);
}

}  // namespace
}  // namespace opserve::hardening
