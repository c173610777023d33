// CUDA-graph replay end to end, on the real `opserve --device=cuda`: a graph of two or more
// nodes is captured by its first request and replayed by the next ones of its signature, with
// each request's own tensors bound in, and gives the same bits as the same graph launched node
// by node (--graph_cache=0). Skipped (not passed) where no GPU is usable.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/gpu/gpu_server_fixture.h"
#include "tests/gpu/suite_device.h"

namespace opserve::e2e {
namespace {

// One lane: its launch thread takes the context freed last, so back-to-back requests from one
// client meet the graph their predecessor captured.
class GpuReplayTest : public GpuServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--lanes=1"}; }
};

// What one request gave: every returned output's bytes, the stored output's, and how it ran.
struct RunResult {
  std::vector<std::string> outputs;
  std::string stored;
  v1::GraphReplay graph = v1::GRAPH_NOT_USED;
};

// row_mean(transpose(matmul(A, B))) + sum(row_sum(X)): matmul, the tensor-map transpose and
// CUB's reductions (which take scratch from the graph) in one graph; A and X stored, B inline.
v1::ExecuteRequest DemoGraph(const client::HostTensor& b, const std::string& mm,
                             const std::string& tr, const std::string& rs, const std::string& s) {
  v1::ExecuteRequest req;
  AddInline(req, "B", b);
  AddNode(req, "ab", "matmul", {Stored("A"), Inline("B")}, mm);
  AddNode(req, "abt", "transpose", {Node("ab")}, tr);
  AddNode(req, "mean", "row_mean", {Node("abt")}, "auto");
  AddNode(req, "rows", "row_sum", {Stored("X")}, rs);
  AddNode(req, "total", "sum", {Node("rows")}, s);
  AddOutput(req, "mean", true);
  AddOutput(req, "total", true);
  AddOutput(req, "ab", false, "AB", true);
  return req;
}

absl::StatusOr<RunResult> Execute(client::Client& c, const v1::ExecuteRequest& req) {
  auto resp = c.Execute(req);
  if (!resp.ok()) return resp.status();
  RunResult run;
  run.graph = resp->graph();
  for (const v1::NamedTensor& t : resp->outputs()) run.outputs.push_back(t.tensor().data());
  for (const v1::NodeResult& r : resp->nodes()) {
    if (r.kernel_us() <= 0) {
      return absl::InternalError("node '" + r.id() + "' reports no kernel time");
    }
  }
  auto stored = c.GetTensor("AB");
  if (!stored.ok()) return stored.status();
  run.stored = stored->data;
  return run;
}

TEST_F(GpuReplayTest, ReplayGivesTheBitsOfNodeByNodeWithEachRequestsTensors) {
  // Two versions of every input: the second request rebinds nothing, the third a new A (an
  // overwrite moves it), the fourth a new inline B.
  const client::HostTensor a1 = RandomFloats({384, 200}, rng_), a2 = RandomFloats({384, 200}, rng_);
  const client::HostTensor b1 = RandomFloats({200, 264}, rng_), b2 = RandomFloats({200, 264}, rng_);
  const client::HostTensor x = RandomFloats({97, 1031}, rng_);
  using Step = std::tuple<const client::HostTensor*, const client::HostTensor*>;
  const std::vector<Step> steps = {{&a1, &b1}, {&a1, &b1}, {&a2, &b1}, {&a2, &b2}};
  // Deterministic rows only: bit equality is the claim. The tensor-map transpose where the
  // suite's device runs it (not under --max-cc=8.0).
  const std::string tma = gpu_suite::SuiteDevice().Runs("transpose", "tma") ? "tma" : "smem_tiled";
  const std::vector<std::vector<std::string>> algorithms = {
      {"cublas", tma, "cub_segmented", "cub"},
      {"block_tiled_vectorized", "swizzled", "block_per_row", "two_pass"}};

  // Runs every step of every algorithm set on the current server.
  auto run_all = [&](std::vector<RunResult>* runs) {
    ASSERT_TRUE(client().PutTensor("X", x, true).ok());
    for (const auto& algos : algorithms) {
      for (const auto& [a, b] : steps) {
        ASSERT_TRUE(client().PutTensor("A", *a, true).ok());
        auto run = Execute(client(), DemoGraph(*b, algos[0], algos[1], algos[2], algos[3]));
        ASSERT_TRUE(run.ok()) << run.status();
        runs->push_back(*std::move(run));
      }
    }
  };

  std::vector<RunResult> replayed;
  run_all(&replayed);
  ASSERT_EQ(replayed.size(), algorithms.size() * steps.size());
  for (size_t i = 0; i < replayed.size(); ++i) {
    // The first request of each algorithm set captures; the rest replay, rebinding where a
    // tensor moved (an overwritten A, a new inline B) or as it is.
    if (i % steps.size() == 0) {
      EXPECT_EQ(replayed[i].graph, v1::GRAPH_CAPTURED) << "request " << i;
    } else {
      EXPECT_TRUE(replayed[i].graph == v1::GRAPH_REPLAYED || replayed[i].graph == v1::GRAPH_REBOUND)
          << "request " << i << ": " << v1::GraphReplay_Name(replayed[i].graph);
    }
  }

  Restart({"--lanes=1", "--graph_cache=0"});
  std::vector<RunResult> direct;
  run_all(&direct);
  ASSERT_EQ(direct.size(), replayed.size());
  for (size_t i = 0; i < direct.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(direct[i].graph, v1::GRAPH_NOT_USED);
    EXPECT_EQ(replayed[i].outputs, direct[i].outputs);
    EXPECT_EQ(replayed[i].stored, direct[i].stored);
  }
  // The steps' inputs differ, so must their results: a replay that kept the first request's
  // tensors would repeat its answer.
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i] == steps[i - 1]) continue;
    EXPECT_NE(direct[i].stored, direct[i - 1].stored) << "step " << i;
  }
}

TEST_F(GpuReplayTest, OneNodeGraphsRunDirectly) {
  ASSERT_TRUE(client().PutTensor("X", RandomFloats({64, 300}, rng_), false).ok());
  v1::ExecuteRequest req;
  AddNode(req, "m", "row_mean", {Stored("X")}, "auto");
  AddOutput(req, "m", true);
  for (int i = 0; i < 3; ++i) {
    auto resp = client().Execute(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->graph(), v1::GRAPH_NOT_USED);
  }
}

}  // namespace
}  // namespace opserve::e2e
