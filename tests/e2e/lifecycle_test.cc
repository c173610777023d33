// The server's life around requests: SIGTERM with a request in flight (it completes, new calls
// are refused, the process exits 0), the --max_inflight limit, and a client that walks away
// mid-upload (nothing is stored, the memory goes back).
#include <grpcpp/client_context.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1 << 20;
// How long a small unary request takes to reach the server's device worker, generously.
constexpr auto kReachServer = std::chrono::milliseconds(250);

// A matmul sized to keep this machine's CPU backend busy for about `seconds`, with inputs whose
// result is exact: A is all ones, so C[i][j] is the sum of column j of B (small integers).
class BusyMatmul {
 public:
  // Times a small matmul on the server, sizes the busy one from it, then times that too and
  // resizes once more if the rate did not carry over (thread counts differ with the size).
  static absl::StatusOr<BusyMatmul> Prepare(client::Client& c, double seconds,
                                            std::mt19937_64& rng) {
    v1::ExecuteRequest probe;
    AddInline(probe, "a", v1::FLOAT32, {384, 384});
    AddNode(probe, "mm", "matmul", {Inline("a"), Inline("a")});
    double flops_per_s = 0;
    for (int i = 0; i < 2; ++i) {  // the second run is warm
      absl::StatusOr<v1::ExecuteResponse> r = c.Execute(probe);
      if (!r.ok()) return r.status();
      flops_per_s = 2.0 * 384 * 384 * 384 / (r->nodes(0).kernel_us() * 1e-6);
    }
    BusyMatmul m;
    for (int pass = 0;; ++pass) {
      m.n_ = std::clamp<int64_t>(static_cast<int64_t>(std::cbrt(seconds * flops_per_s / 2)), 256,
                                 4096);
      m.expected_s_ = 2.0 * m.n_ * m.n_ * m.n_ / flops_per_s;
      if (auto s = m.Store(c, rng); !s.ok()) return s;
      if (pass == 2) break;
      absl::StatusOr<v1::ExecuteResponse> r = c.Execute(m.Request());
      if (!r.ok()) return r.status();
      const double took = r->nodes(0).kernel_us() * 1e-6;
      flops_per_s = 2.0 * m.n_ * m.n_ * m.n_ / took;
      if (took > 0.6 * seconds && took < 1.6 * seconds) {
        m.expected_s_ = took;
        break;
      }
    }
    return m;
  }

  v1::ExecuteRequest Request() const {
    v1::ExecuteRequest r;
    AddNode(r, "busy", "matmul", {Stored("ones"), Stored("b")});
    AddOutput(r, "busy", true);
    return r;
  }

  ::testing::AssertionResult Check(const v1::ExecuteResponse& resp) const {
    return IsExactMatmul(resp, n_, col_sums_);
  }

  // Makes the matmul about `factor` times the work (when the CPUs got faster than calibrated,
  // e.g. because other tests sharing them finished).
  absl::Status Grow(client::Client& c, double factor, std::mt19937_64& rng) {
    n_ = std::min<int64_t>(4096, static_cast<int64_t>(n_ * std::cbrt(factor)) + 1);
    expected_s_ *= factor;
    return Store(c, rng);
  }

  int64_t n() const { return n_; }

  double expected_seconds() const { return expected_s_; }

 private:
  absl::Status Store(client::Client& c, std::mt19937_64& rng) {
    absl::StatusOr<std::vector<float>> col_sums = StoreExactMatmulInputs(c, "ones", "b", n_, rng);
    if (!col_sums.ok()) return col_sums.status();
    col_sums_ = *std::move(col_sums);
    return absl::OkStatus();
  }

  int64_t n_ = 0;
  double expected_s_ = 0;
  std::vector<float> col_sums_;
};

// The busy request on its own thread, known to be in flight: it is (re)started, bigger each
// time, until it is still running kReachServer after it was sent.
class BusyCall {
 public:
  BusyCall(client::Client& c, BusyMatmul& busy, std::mt19937_64& rng)
      : c_(c), busy_(busy), rng_(rng) {}
  ~BusyCall() {
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Start() {
    for (int attempt = 0; attempt < 4; ++attempt) {
      done_ = false;
      thread_ = std::thread([this] {
        result_ = c_.Execute(busy_.Request());
        done_ = true;
      });
      sent_ = Clock::now();
      std::this_thread::sleep_for(kReachServer);
      if (!done_.load()) return absl::OkStatus();
      thread_.join();
      if (!result_.ok()) return result_.status();
      if (auto s = busy_.Grow(c_, 8.0, rng_); !s.ok()) return s;
    }
    return absl::DeadlineExceededError("could not keep the server busy for long enough");
  }
  bool done() const { return done_.load(); }
  Clock::time_point sent() const { return sent_; }
  absl::StatusOr<v1::ExecuteResponse> Join() {
    thread_.join();
    return result_;
  }

 private:
  client::Client& c_;
  BusyMatmul& busy_;
  std::mt19937_64& rng_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  absl::StatusOr<v1::ExecuteResponse> result_ = absl::UnknownError("not run");
  Clock::time_point sent_;
};

using LifecycleTest = OpserveTest;

TEST_F(LifecycleTest, SigtermFinishesTheRequestInFlightAndExitsZero) {
  SKIP_UNLESS_CPU_BACKEND("keeps the device busy with a slow CPU matmul");
  absl::StatusOr<BusyMatmul> busy = BusyMatmul::Prepare(client(), /*seconds=*/2.0, rng_);
  ASSERT_TRUE(busy.ok()) << busy.status();
  BusyCall call(client(), *busy, rng_);
  const absl::Status started = call.Start();
  ASSERT_TRUE(started.ok()) << started;
  server().Signal(SIGTERM);
  const auto signalled = Clock::now();

  // While it drains, a new call is refused (or, if it already exited, cannot connect).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  client::ClientOptions late_options;
  late_options.target = server().target();
  late_options.timeout = absl::Seconds(5);
  auto late = client::Client::Connect(late_options);
  ASSERT_TRUE(late.ok());
  v1::ExecuteRequest small;
  AddNode(small, "s", "sum", {Stored("b")});
  EXPECT_FALSE((*late)->Execute(small).ok()) << "a new request was accepted after SIGTERM";

  absl::StatusOr<v1::ExecuteResponse> result = call.Join();
  ASSERT_TRUE(result.ok()) << "the request in flight failed: " << result.status();
  EXPECT_TRUE(busy->Check(*result));
  std::cout << "[ BUSY     ] matmul " << busy->n() << "^3 took "
            << std::chrono::duration<double>(Clock::now() - call.sent()).count() << " s, "
            << std::chrono::duration<double>(Clock::now() - signalled).count()
            << " s of it after SIGTERM" << std::endl;

  // The fixture's client keeps its connection open, idle: the exit must not wait for it (gRPC's
  // Shutdown waits for every client to hang up, and grpc_shutdown for a ~10 s epoll timeout;
  // this took 10-12 s before main.cc dealt with both).
  const auto answered = Clock::now();
  absl::StatusOr<int> status = server().WaitForExit(std::chrono::seconds(30));
  const double exit_s = std::chrono::duration<double>(Clock::now() - answered).count();
  EXPECT_LT(exit_s, 5.0) << "the drained server took " << exit_s << " s to exit";
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(WIFEXITED(*status)) << "the server did not exit normally (signal "
                                  << (WIFSIGNALED(*status) ? WTERMSIG(*status) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

TEST_F(LifecycleTest, SigintWhenIdleExitsZero) {
  // Well after start-up (SignalRace covers the moment of start-up itself).
  ASSERT_TRUE(Serving());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server().Signal(SIGINT);
  absl::StatusOr<int> status = server().WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

// A supervisor may send SIGTERM the moment it sees the server is up: from the "listening" line
// on, SIGTERM must drain and exit 0, never kill the process with the default action.
TEST(SignalRace, SigtermRightAfterTheListeningLineExitsZero) {
  // One CPU for this thread, the output reader it starts and the child (all inherit the mask):
  // the reader, woken by the line, then tends to run before the server's next statement, which
  // makes a gap between printing the line and installing the handlers show up reliably.
  cpu_set_t saved, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  struct Restore {
    cpu_set_t mask;
    ~Restore() { sched_setaffinity(0, sizeof mask, &mask); }
  } restore{saved};
  constexpr int kStarts = 30;
  int killed_by_signal = 0;
  for (int i = 0; i < kStarts; ++i) {
    auto server = ServerProcess::Start(
        OpserveBinary(),
        {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1", "--device=cpu"},
        std::chrono::seconds(20), /*signal_when_listening=*/SIGTERM);
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<int> status = (*server)->WaitForExit(std::chrono::seconds(30));
    ASSERT_TRUE(status.ok()) << status.status();
    if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) ++killed_by_signal;
  }
  EXPECT_EQ(killed_by_signal, 0) << killed_by_signal << " of " << kStarts
                                 << " servers did not exit 0 on a SIGTERM sent right after their "
                                    "listening line";
}

class InflightLimitTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--max_inflight=1"}; }
};

TEST_F(InflightLimitTest, ASecondRequestWhileTheDeviceIsBusyIsResourceExhausted) {
  SKIP_UNLESS_CPU_BACKEND("keeps the device busy with a slow CPU matmul");
  absl::StatusOr<BusyMatmul> busy = BusyMatmul::Prepare(client(), /*seconds=*/1.5, rng_);
  ASSERT_TRUE(busy.ok()) << busy.status();
  BusyCall call(client(), *busy, rng_);
  const absl::Status started = call.Start();
  ASSERT_TRUE(started.ok()) << started;
  v1::ExecuteRequest small;
  AddInline(small, "x", F32({}, {1.f}));
  AddNode(small, "s", "sum", {Inline("x")});
  AddOutput(small, "s", true);
  const bool in_flight = !call.done();
  absl::Status second = client().Execute(small).status();
  absl::StatusOr<v1::ExecuteResponse> result = call.Join();
  ASSERT_TRUE(in_flight) << "the busy request finished too soon; nothing was tested";
  EXPECT_TRUE(StatusIs(second, absl::StatusCode::kResourceExhausted, {"max_inflight"}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(busy->Check(*result));
  EXPECT_TRUE(Serving());
  EXPECT_TRUE(client().Execute(small).ok());  // free again
}

class AbandonedUploadTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--memory_budget_bytes=", 8 * kMiB)};
  }
};

TEST_F(AbandonedUploadTest, CancelledUploadStoresNothingAndReturnsItsMemory) {
  {
    grpc::ClientContext ctx;
    v1::PutTensorResponse resp;
    auto w = stub().PutTensor(&ctx, &resp);
    v1::PutTensorRequest header;
    header.mutable_header()->set_name("partial");
    header.mutable_header()->set_dtype(v1::FLOAT32);
    header.mutable_header()->add_shape(6 * kMiB / 4);  // 6 of the 8 MiB
    ASSERT_TRUE(w->Write(header));
    v1::PutTensorRequest chunk;
    chunk.set_chunk(std::string(kMiB, '\1'));
    ASSERT_TRUE(w->Write(chunk));
    ctx.TryCancel();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(Serving());
  // The server sees the cancellation asynchronously: within a few seconds the 6 MiB it held for
  // the upload must be back, so another 6 MiB tensor fits.
  absl::Status put = absl::UnknownError("not tried");
  for (auto deadline = Clock::now() + std::chrono::seconds(5); Clock::now() < deadline;) {
    put = client()
              .PutTensor("whole", RandomTensor(v1::FLOAT32, {6 * 1024 * 256}, rng_), false)
              .status();
    if (put.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(put.ok()) << put;
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client().ListTensors();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name(), "whole");
}

// A second server on a port already in use exits at start-up, naming the address, instead of
// sharing the port (SO_REUSEPORT) and splitting the clients' calls between two tensor stores.
TEST(PortTest, ASecondServerOnAPortInUseRefusesToStart) {
  const std::vector<std::string> flags = {"--host=127.0.0.1", "--metrics_port=-1",
                                          "--http_port=-1", "--device=cpu"};
  std::vector<std::string> first_flags = flags;
  first_flags.push_back("--port=0");
  auto first = ServerProcess::Start(OpserveBinary(), first_flags);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  std::vector<std::string> second_flags = flags;
  second_flags.push_back(absl::StrCat("--port=", (*first)->port()));
  auto second = ServerProcess::Start(OpserveBinary(), second_flags);
  ASSERT_FALSE(second.ok()) << "a second server listens on " << address;
  EXPECT_NE(std::string(second.status().message()).find("cannot listen on " + address),
            std::string::npos)
      << second.status();
  EXPECT_TRUE((*first)->Alive());
}

}  // namespace
}  // namespace opserve::e2e
