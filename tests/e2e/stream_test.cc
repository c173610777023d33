// ExecuteStream and ModelStreamInfer (server/rpc/graph_stream.h) through the generated stubs:
// many requests pipelined on one stream, each answer matched by its id and checked; a failing
// request answered on its own while its neighbours succeed and the stream stays open; the
// window's backpressure (the server's opserve_stream_* metrics); a client that cancels; a server
// drained with a stream open.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "inference/grpc_service.grpc.pb.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWindow = 4;

// The row means of FLOAT32[rows, cols] `t`, as row_mean returns them.
std::vector<float> RowMeans(const client::HostTensor& t) {
  const std::vector<float> v = Floats(t.data);
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<float> means(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += v[r * cols + c];
    means[r] = static_cast<float>(s / cols);
  }
  return means;
}

::testing::AssertionResult Near(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-5f + 1e-5f * std::fabs(want[i]))) {
      return ::testing::AssertionFailure() << "[" << i << "] = " << got[i] << ", expected " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// One ExecuteStream request: row_mean of inline `x`, returned.
v1::ExecuteStreamRequest RowMeanRequest(const std::string& id, const client::HostTensor& x) {
  v1::ExecuteStreamRequest r;
  r.set_id(id);
  AddInline(*r.mutable_request(), "x", x);
  AddNode(*r.mutable_request(), "m", "row_mean", {Inline("x")});
  AddOutput(*r.mutable_request(), "m", /*return_inline=*/true);
  return r;
}

// A stream's answers, read on a thread of their own while the test writes.
template <typename Request, typename Response>
class Answers {
 public:
  explicit Answers(grpc::ClientReaderWriterInterface<Request, Response>* stream)
      : thread_([this, stream] {
          Response r;
          while (stream->Read(&r)) {
            std::lock_guard lock(mu_);
            got_.push_back(r);
            cv_.notify_all();
          }
          std::lock_guard lock(mu_);
          ended_ = true;
          cv_.notify_all();
        }) {}
  ~Answers() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits (10 s at most) for `n` answers; whether they came.
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return got_.size() >= n || ended_; }) &&
           got_.size() >= n;
  }
  std::vector<Response> got() {
    std::lock_guard lock(mu_);
    return got_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Response> got_;
  bool ended_ = false;
  std::thread thread_;
};

class StreamTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--metrics_port=0", absl::StrCat("--stream_window=", kWindow)};
  }
  // The value of the unlabelled series `name` on the server's /metrics.
  double Metric(const std::string& name) {
    absl::StatusOr<std::string> text = HttpGetMetrics(ParseMetricsPort(server().Output()));
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) return -1;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::ConsumePrefix(&line, name + " ")) continue;
      double v = 0;
      if (absl::SimpleAtod(line, &v)) return v;
    }
    ADD_FAILURE() << "no series " << name;
    return -1;
  }
  // Waits (10 s at most) for `name` to reach `value`.
  bool MetricReaches(const std::string& name, double value) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Metric(name) < value) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  // Whether the metric comes down to `value` within 10 s: a gauge that falls as requests end,
  // which a slow (sanitized) server may still be counting down when the client has its answer.
  bool MetricFallsTo(const std::string& name, double value) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Metric(name) != value) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
};

TEST_F(StreamTest, ExecuteStreamPipelinesRequestsAndAnswersEachByItsId) {
  constexpr int kRequests = 48;
  std::map<std::string, std::vector<float>> want;
  grpc::ClientContext ctx;
  auto stream = stub().ExecuteStream(&ctx);
  Answers<v1::ExecuteStreamRequest, v1::ExecuteStreamResponse> answers(stream.get());
  for (int i = 0; i < kRequests; ++i) {
    const client::HostTensor x = RandomFloats({1 + i % 7, 3 + i}, rng_);
    const std::string id = absl::StrCat("req-", i);
    want[id] = RowMeans(x);
    ASSERT_TRUE(stream->Write(RowMeanRequest(id, x)));
  }
  ASSERT_TRUE(stream->WritesDone());
  answers.Join();
  ASSERT_TRUE(stream->Finish().ok());
  std::map<std::string, int> seen;
  for (const v1::ExecuteStreamResponse& r : answers.got()) {
    ++seen[r.id()];
    ASSERT_TRUE(r.has_response()) << r.id() << ": " << r.status().message();
    ASSERT_EQ(r.response().outputs_size(), 1) << r.id();
    ASSERT_TRUE(want.count(r.id())) << "an answer for an id never sent: " << r.id();
    EXPECT_TRUE(Near(Floats(r.response().outputs(0).tensor().data()), want[r.id()])) << r.id();
  }
  EXPECT_EQ(seen.size(), want.size());
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 1) << id;
  EXPECT_LE(Metric("opserve_stream_unanswered_peak"), kWindow);
  EXPECT_TRUE(MetricFallsTo("opserve_inflight_requests", 0));
}

TEST_F(StreamTest, AFailingRequestIsAnsweredAloneAndTheStreamStaysOpen) {
  grpc::ClientContext ctx;
  auto stream = stub().ExecuteStream(&ctx);
  Answers<v1::ExecuteStreamRequest, v1::ExecuteStreamResponse> answers(stream.get());
  const client::HostTensor x = RandomFloats({2, 5}, rng_);
  ASSERT_TRUE(stream->Write(RowMeanRequest("ok-0", x)));
  v1::ExecuteStreamRequest no_such = RowMeanRequest("bad-name", x);
  no_such.mutable_request()->mutable_nodes(0)->mutable_inputs(0)->set_inline_name("nope");
  ASSERT_TRUE(stream->Write(no_such));
  v1::ExecuteStreamRequest bad_shape = RowMeanRequest("bad-shape", x);
  (*bad_shape.mutable_request()->mutable_inline_tensors())["x"].mutable_shape()->Set(1, 6);
  ASSERT_TRUE(stream->Write(bad_shape));
  ASSERT_TRUE(stream->Write(RowMeanRequest("ok-1", x)));
  ASSERT_TRUE(answers.WaitFor(4)) << "the stream did not answer every request";
  // Still open: one more after the failures.
  ASSERT_TRUE(stream->Write(RowMeanRequest("ok-2", x)));
  ASSERT_TRUE(stream->WritesDone());
  answers.Join();
  ASSERT_TRUE(stream->Finish().ok());
  std::map<std::string, v1::ExecuteStreamResponse> by_id;
  for (const auto& r : answers.got()) by_id[r.id()] = r;
  ASSERT_EQ(by_id.size(), 5u);
  for (const char* id : {"ok-0", "ok-1", "ok-2"}) {
    ASSERT_TRUE(by_id[id].has_response()) << id << ": " << by_id[id].status().message();
    EXPECT_TRUE(Near(Floats(by_id[id].response().outputs(0).tensor().data()), RowMeans(x)));
  }
  for (const char* id : {"bad-name", "bad-shape"}) {
    ASSERT_TRUE(by_id[id].has_status()) << id;
    EXPECT_EQ(by_id[id].status().code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
  }
  EXPECT_NE(by_id["bad-name"].status().message().find("nope"), std::string::npos)
      << by_id["bad-name"].status().message();
  EXPECT_NE(by_id["bad-shape"].status().message().find("'x'"), std::string::npos)
      << by_id["bad-shape"].status().message();
}

// A message that does not parse is answered on the stream (INVALID_ARGUMENT, as a unary call's
// would be), and the stream goes on.
TEST_F(StreamTest, AMessageThatDoesNotParseIsAnsweredOnTheStream) {
  const std::string good = RowMeanRequest("good", RandomFloats({2, 3}, rng_)).SerializeAsString();
  const RawResult r =
      RawCall(server().target(), "ExecuteStream", {good, std::string("\x0a\xff\xff", 3), good});
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.responses, 3);
  EXPECT_EQ(Metric("opserve_requests_total{code=\"INVALID_ARGUMENT\",rpc=\"ExecuteStream\"}"), 1);
  EXPECT_EQ(Metric("opserve_requests_total{code=\"OK\",rpc=\"ExecuteStream\"}"), 2);
}

// The client writes every request before reading any answer, and each answer is 1 MiB: the
// server's writes wait for the client, its window fills and it stops reading, then drains it
// all once the client reads.
TEST_F(StreamTest, AFullWindowStopsReadingUntilAnswersAreRead) {
  constexpr int kRequests = 24, kSide = 512;
  ASSERT_TRUE(client().PutTensor("big", RandomFloats({kSide, kSide}, rng_), false).ok());
  grpc::ClientContext ctx;
  auto stream = stub().ExecuteStream(&ctx);
  for (int i = 0; i < kRequests; ++i) {
    v1::ExecuteStreamRequest r;
    r.set_id(absl::StrCat(i));
    AddNode(*r.mutable_request(), "t", "transpose", {Stored("big")});
    AddOutput(*r.mutable_request(), "t", /*return_inline=*/true);
    ASSERT_TRUE(stream->Write(r));
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(MetricReaches("opserve_stream_window_full_total", 1));
  EXPECT_EQ(Metric("opserve_stream_unanswered_peak"), kWindow);
  v1::ExecuteStreamResponse resp;
  std::set<std::string> ids;
  while (stream->Read(&resp)) {
    ASSERT_TRUE(resp.has_response()) << resp.status().message();
    EXPECT_EQ(resp.response().outputs(0).tensor().data().size(), 4u * kSide * kSide);
    ids.insert(resp.id());
  }
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ids.size(), static_cast<size_t>(kRequests));
  EXPECT_EQ(Metric("opserve_stream_unanswered_peak"), kWindow);
}

TEST_F(StreamTest, AClientCancellingMidStreamLeavesNothingBehind) {
  ASSERT_TRUE(client().PutTensor("big", RandomFloats({512, 512}, rng_), false).ok());
  {
    grpc::ClientContext ctx;
    auto stream = stub().ExecuteStream(&ctx);
    for (int i = 0; i < 12; ++i) {
      v1::ExecuteStreamRequest r;
      r.set_id(absl::StrCat(i));
      AddNode(*r.mutable_request(), "t", "transpose", {Stored("big")});
      AddOutput(*r.mutable_request(), "t", /*return_inline=*/true);
      ASSERT_TRUE(stream->Write(r));
    }
    v1::ExecuteStreamResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    ctx.TryCancel();
    while (stream->Read(&resp)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(MetricFallsTo("opserve_inflight_requests", 0))
      << "requests of the cancelled stream still counted in flight";
  EXPECT_TRUE(Serving());
  // The server takes the next stream as if nothing happened.
  grpc::ClientContext ctx;
  auto stream = stub().ExecuteStream(&ctx);
  const client::HostTensor x = RandomFloats({3, 4}, rng_);
  ASSERT_TRUE(stream->Write(RowMeanRequest("after", x)));
  v1::ExecuteStreamResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_TRUE(Near(Floats(resp.response().outputs(0).tensor().data()), RowMeans(x)));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// SIGTERM with a stream open and requests on it: the drain waits for the stream until the grace
// deadline, then cancels it; every request sent is answered or the stream ends, and the server
// exits 0.
TEST_F(StreamTest, TheDrainWaitsForAnOpenStreamThenEndsIt) {
  Restart({"--shutdown_grace_seconds=1"});
  grpc::ClientContext ctx;
  auto stream = stub().ExecuteStream(&ctx);
  const client::HostTensor x = RandomFloats({3, 4}, rng_);
  ASSERT_TRUE(stream->Write(RowMeanRequest("before", x)));
  v1::ExecuteStreamResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_response());
  const auto signalled = Clock::now();
  server().Signal(SIGTERM);
  // Open through the grace period: a request sent now is still answered.
  ASSERT_TRUE(stream->Write(RowMeanRequest("during", x)));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.id(), "during");
  while (stream->Read(&resp)) {
  }
  const grpc::Status s = stream->Finish();
  EXPECT_FALSE(s.ok()) << "the stream ended OK without the client half-closing";
  absl::StatusOr<int> code = server().WaitForExit(std::chrono::seconds(15));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - signalled).count(), 0.9)
      << "the drain did not wait for the open stream";
}

// ModelStreamInfer: row_mean model requests by id, a bad input name and a bad shape among
// them, answered as ModelInfer answers them and counted in the model's statistics.
TEST_F(StreamTest, ModelStreamInferAnswersEachRequestByItsId) {
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  const auto request = [](const std::string& id, const client::HostTensor& x) {
    inference::ModelInferRequest req;
    req.set_model_name("row_mean");
    req.set_id(id);
    auto* in = req.add_inputs();
    in->set_name("x");
    in->set_datatype("FP32");
    for (int64_t d : x.shape) in->add_shape(d);
    req.add_raw_input_contents(x.data);
    return req;
  };
  constexpr int kRequests = 20;
  std::map<std::string, std::vector<float>> want;
  grpc::ClientContext ctx;
  auto stream = stub->ModelStreamInfer(&ctx);
  Answers<inference::ModelInferRequest, inference::ModelStreamInferResponse> answers(stream.get());
  for (int i = 0; i < kRequests; ++i) {
    const client::HostTensor x = RandomFloats({1 + i % 5, 2 + i}, rng_);
    inference::ModelInferRequest req = request(absl::StrCat("r", i), x);
    if (i == 7) req.mutable_inputs(0)->set_name("nope");
    if (i == 11) req.mutable_inputs(0)->set_shape(1, 99);
    if (i != 7 && i != 11) want[req.id()] = RowMeans(x);
    ASSERT_TRUE(stream->Write(req));
  }
  ASSERT_TRUE(answers.WaitFor(kRequests));
  const client::HostTensor x = RandomFloats({2, 3}, rng_);
  want["last"] = RowMeans(x);
  ASSERT_TRUE(stream->Write(request("last", x)));
  ASSERT_TRUE(stream->WritesDone());
  answers.Join();
  ASSERT_TRUE(stream->Finish().ok());
  std::map<std::string, inference::ModelStreamInferResponse> by_id;
  for (const auto& r : answers.got()) by_id[r.infer_response().id()] = r;
  ASSERT_EQ(by_id.size(), static_cast<size_t>(kRequests + 1));
  for (const auto& [id, means] : want) {
    const inference::ModelStreamInferResponse& r = by_id[id];
    ASSERT_EQ(r.error_message(), "") << id;
    ASSERT_EQ(r.infer_response().raw_output_contents_size(), 1) << id;
    EXPECT_TRUE(Near(Floats(r.infer_response().raw_output_contents(0)), means)) << id;
  }
  EXPECT_NE(by_id["r7"].error_message().find("nope"), std::string::npos) << by_id["r7"].error_message();
  EXPECT_EQ(by_id["r7"].infer_response().model_name(), "row_mean");
  EXPECT_NE(by_id["r11"].error_message().find("x"), std::string::npos);
  EXPECT_EQ(by_id["r11"].infer_response().raw_output_contents_size(), 0);

  grpc::ClientContext stats_ctx;
  inference::ModelStatisticsRequest stats_req;
  stats_req.set_name("row_mean");
  inference::ModelStatisticsResponse stats;
  ASSERT_TRUE(stub->ModelStatistics(&stats_ctx, stats_req, &stats).ok());
  ASSERT_EQ(stats.model_stats_size(), 1);
  EXPECT_EQ(stats.model_stats(0).inference_stats().success().count(), want.size());
  EXPECT_EQ(stats.model_stats(0).inference_stats().fail().count(), 2u);
}

}  // namespace
}  // namespace opserve::e2e
