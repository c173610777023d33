// The engine's request path without gRPC (so that the unit suite's strict ThreadSanitizer run
// sees every hand-off): Engine::Submit plans a Request, queues it alone or in a batch, a lane
// runs its stages, and the client hears back exactly once, with the run's result or the status
// that stopped it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/engine.h"

namespace opserve {
namespace {

// A caller that counts its hand-backs and keeps the last one's status and result.
class TestClient final : public RequestClient {
 public:
  absl::Status CheckAlive() const override { return alive; }
  void Done(std::unique_ptr<Request> request) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    status_ = request->status();
    if (status_.ok()) result_ = std::move(request->result());
    cv_.notify_all();
  }
  // Whether the request came back within a while (a test fails rather than hangs).
  bool WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_ > 0; });
  }
  int done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  ExecuteResult& result() { return result_; }  // read once done

  absl::Status alive = absl::OkStatus();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
  absl::Status status_;
  ExecuteResult result_;
};

// A graph of one sum over fresh random FLOAT32 values, and the sum the result must hold.
class SumGraph {
 public:
  explicit SumGraph(int n, unsigned seed) : x_(n), shape_{n} {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-50, 50);  // integers: every order sums exactly
    for (float& v : x_) {
      v = static_cast<float>(small(rng));
      want_ += v;
    }
  }
  Graph Make() const {
    Graph g;
    GraphNode& n = g.nodes.emplace_back();
    n.id = "s";
    n.op = "sum";
    n.inputs.push_back({GraphInput::Source::kInline, "x"});
    g.inlines.push_back({.name = "x", .dtype = static_cast<int>(DType::kFloat32),
                         .shape = shape_,
                         .data = absl::string_view(reinterpret_cast<const char*>(x_.data()),
                                                   x_.size() * sizeof(float))});
    g.outputs.push_back({.node = "s", .return_inline = true});
    return g;
  }
  float want() const { return want_; }

 private:
  std::vector<float> x_;
  std::vector<int64_t> shape_;
  float want_ = 0;
};

float ReturnedFloat(const ExecuteResult& r) {
  float v = std::nanf("");
  if (r.outputs.size() == 1 && r.outputs[0].data.size() == sizeof(float)) {
    std::memcpy(&v, r.outputs[0].data.data(), sizeof(float));
  }
  return v;
}

// One lane of one context: a job that holds it keeps every request waiting in the queue.
struct Fixture {
  explicit Fixture(int max_queue, int max_batch_size = 1) {
    auto d = Device::Start(MakeCpuBackend(0), /*lanes=*/1, max_queue, std::chrono::microseconds(0),
                           nullptr, /*completion_threads=*/1, /*contexts=*/1);
    EXPECT_TRUE(d.ok()) << d.status();
    device = *std::move(d);
    const Limits limits{.max_tensor_bytes = 1 << 20, .max_graph_nodes = 16,
                        .max_message_bytes = 1 << 20};
    Device* devices[] = {device.get()};
    engine = std::make_unique<Engine>(
        devices, store, nullptr, nullptr,
        EngineOptions{.limits = limits, .max_batch_size = max_batch_size});
  }
  ~Fixture() { device->Shutdown(); }  // runs what is queued while the engine still exists
  std::unique_ptr<Request> NewRequest(TestClient& client, const SumGraph& graph) {
    return std::make_unique<Request>("Execute", Request::Clock::now(), nullptr, client, "",
                                     graph.Make());
  }
  TensorStore store;
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;
};

TEST(EngineTest, ARequestRunsAndComesBackOnceWithItsResult) {
  Fixture f(/*max_queue=*/4);
  TestClient client;
  const SumGraph graph(1000, 1);
  f.engine->Submit(f.NewRequest(client, graph));
  ASSERT_TRUE(client.WaitDone());
  ASSERT_TRUE(client.status().ok()) << client.status();
  EXPECT_EQ(ReturnedFloat(client.result()), graph.want());
  EXPECT_EQ(client.result().batch_size, 1);
  f.device->Shutdown();
  EXPECT_EQ(client.done(), 1);
}

TEST(EngineTest, AnInvalidGraphComesBackBeforeSubmitReturns) {
  Fixture f(/*max_queue=*/4);
  TestClient client;
  Graph g;
  GraphNode& n = g.nodes.emplace_back();
  n.id = "n";
  n.op = "no_such_op";
  f.engine->Submit(std::make_unique<Request>("Execute", Request::Clock::now(), nullptr, client,
                                             "", std::move(g)));
  EXPECT_EQ(client.done(), 1);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(), "no_such_op")) << client.status();
}

TEST(EngineTest, AFullQueueComesBackResourceExhausted) {
  Fixture f(/*max_queue=*/1);
  std::latch release(1);
  ASSERT_TRUE(f.device->Submit([&](ExecEnv&) { release.wait(); }).ok());
  TestClient client;
  const SumGraph graph(10, 2);
  f.engine->Submit(f.NewRequest(client, graph));
  EXPECT_EQ(client.done(), 1);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kResourceExhausted) << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(), "--max_inflight=1")) << client.status();
  release.count_down();
  f.device->Shutdown();  // the job is done with the latch before it goes
}

TEST(EngineTest, ACallerGoneBeforeTheLaunchComesBackWithItsStatus) {
  Fixture f(/*max_queue=*/4);
  TestClient client;
  client.alive = absl::DeadlineExceededError("the request's deadline passed");
  const SumGraph graph(10, 3);
  f.engine->Submit(f.NewRequest(client, graph));
  ASSERT_TRUE(client.WaitDone());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded) << client.status();
  f.device->Shutdown();
  EXPECT_EQ(client.done(), 1);
}

// Requests of one signature that wait together run as one plan, and each comes back once with
// its own output; one whose caller left meanwhile comes back with its own status.
TEST(EngineTest, RequestsThatWaitTogetherRunAsOneBatchEachWithItsOwnResult) {
  constexpr int kRequests = 3;
  Fixture f(/*max_queue=*/16, /*max_batch_size=*/4);
  std::latch release(1);
  ASSERT_TRUE(f.device->Submit([&](ExecEnv&) { release.wait(); }).ok());
  std::vector<std::unique_ptr<TestClient>> clients;
  std::vector<std::unique_ptr<SumGraph>> graphs;
  for (int i = 0; i < kRequests + 1; ++i) {
    clients.push_back(std::make_unique<TestClient>());
    graphs.push_back(std::make_unique<SumGraph>(257, 10 + i));
  }
  clients.back()->alive = absl::CancelledError("the client cancelled the request");
  for (int i = 0; i < kRequests + 1; ++i) f.engine->Submit(f.NewRequest(*clients[i], *graphs[i]));
  EXPECT_EQ(f.device->queue_depth(), 2) << "the blocking job and one batch";
  release.count_down();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(clients[i]->WaitDone()) << i;
    ASSERT_TRUE(clients[i]->status().ok()) << i << ": " << clients[i]->status();
    EXPECT_EQ(ReturnedFloat(clients[i]->result()), graphs[i]->want()) << i;
    EXPECT_EQ(clients[i]->result().batch_size, kRequests) << i;
  }
  ASSERT_TRUE(clients.back()->WaitDone());
  EXPECT_EQ(clients.back()->status().code(), absl::StatusCode::kCancelled);
  f.device->Shutdown();
  for (int i = 0; i < kRequests + 1; ++i) EXPECT_EQ(clients[i]->done(), 1) << i;
}

}  // namespace
}  // namespace opserve
