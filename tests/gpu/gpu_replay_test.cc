// CUDA-graph replay end to end, on the real `opserve --device=cuda`: a graph (of one node or
// more) is captured by its first request and replayed by the next ones of its signature, with
// each request's own tensors bound in, and gives the same bits as the same graph launched node
// by node (--graph_cache=0). Skipped (not passed) where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// One node replays too, with its output's copy to the host inside the graph. Between the
// replays another request runs on the same context and writes the same transient memory, so
// a replay that skipped the copy, or the fill of an empty input's output, would return the
// other request's numbers.
TEST_F(GpuReplayTest, OneNodeGraphsReplayWithTheirCopyAndFill) {
  v1::ExecuteRequest mean;
  AddNode(mean, "m", "row_mean", {Stored("X")}, "auto");
  AddOutput(mean, "m", true);
  v1::ExecuteRequest empty;  // [3, 0]: no kernel, the output filled with NaN
  AddNode(empty, "e", "row_mean", {Stored("E")}, "auto");
  AddOutput(empty, "e", true);
  ASSERT_TRUE(client().PutTensor("E", client::HostTensor{v1::FLOAT32, {3, 0}, ""}, false).ok());

  auto means = [](const client::HostTensor& x) {
    std::vector<double> m(x.shape[0], 0.0);
    const float* v = reinterpret_cast<const float*>(x.data.data());
    for (int64_t r = 0; r < x.shape[0]; ++r) {
      for (int64_t c = 0; c < x.shape[1]; ++c) m[r] += v[r * x.shape[1] + c];
      m[r] /= static_cast<double>(x.shape[1]);
    }
    return m;
  };
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const client::HostTensor x = RandomFloats({3, 300}, rng_);  // a new X each step: it moves
    ASSERT_TRUE(client().PutTensor("X", x, true).ok());
    auto m = client().Execute(mean);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->graph(), step == 0 ? v1::GRAPH_CAPTURED : v1::GRAPH_REBOUND);
    ASSERT_EQ(m->outputs(0).tensor().data().size(), 3 * sizeof(float));
    const float* got = reinterpret_cast<const float*>(m->outputs(0).tensor().data().data());
    const std::vector<double> want = means(x);
    for (int r = 0; r < 3; ++r) EXPECT_NEAR(got[r], want[r], 1e-5) << "row " << r;

    auto e = client().Execute(empty);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->graph(), step == 0 ? v1::GRAPH_CAPTURED : v1::GRAPH_REPLAYED);
    ASSERT_EQ(e->outputs(0).tensor().data().size(), 3 * sizeof(float));
    const float* nan = reinterpret_cast<const float*>(e->outputs(0).tensor().data().data());
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(std::isnan(nan[r])) << "row " << r << ": " << nan[r];
  }
}

// In a graph the device stamps its clock between nodes instead of recording events: each
// node's kernel_us must still be its own kernel's, as node-by-node events time it. A stamp
// written to another node's place, or read before the device wrote it, would move one node's
// time to another or report nonsense; the nodes here differ in time by 10x.
TEST_F(GpuReplayTest, ReplayedNodesReportTheirOwnKernelTimes) {
  ASSERT_TRUE(client().PutTensor("A", RandomFloats({1024, 2048}, rng_), true).ok());
  ASSERT_TRUE(client().PutTensor("B", RandomFloats({2048, 1024}, rng_), true).ok());
  ASSERT_TRUE(client().PutTensor("X", RandomFloats({8192, 4096}, rng_), true).ok());
  v1::ExecuteRequest req;
  AddNode(req, "ab", "matmul", {Stored("A"), Stored("B")}, "cublas");
  AddNode(req, "m", "row_mean", {Node("ab")}, "block_per_row");
  AddNode(req, "r", "row_sum", {Stored("X")}, "block_per_row");
  AddOutput(req, "m", true);
  AddOutput(req, "r", true);
  const std::vector<std::string> ids = {"ab", "m", "r"};

  // Per node (in `ids` order), the median kernel_us over the requests after the first.
  auto medians = [&](bool as_graph) {
    std::vector<std::vector<double>> us(ids.size());
    for (int i = 0; i < 21; ++i) {
      auto resp = client().Execute(req);
      EXPECT_TRUE(resp.ok()) << resp.status();
      if (!resp.ok() || i == 0) continue;
      // The arena may still grow after the first request: a replay then rebinds.
      EXPECT_EQ(resp->graph() == v1::GRAPH_REPLAYED || resp->graph() == v1::GRAPH_REBOUND, as_graph)
          << "request " << i << ": " << v1::GraphReplay_Name(resp->graph());
      EXPECT_EQ(resp->nodes_size(), static_cast<int>(ids.size()));
      double sum = 0;
      for (const v1::NodeResult& r : resp->nodes()) {
        const auto at = std::find(ids.begin(), ids.end(), r.id());
        EXPECT_NE(at, ids.end()) << r.id();
        if (at == ids.end()) continue;
        EXPECT_GT(r.kernel_us(), 0.0) << r.id();
        us[at - ids.begin()].push_back(r.kernel_us());
        sum += r.kernel_us();
      }
      // The device's time is inside the host's span of the request's compute.
      EXPECT_LE(sum, resp->timing().compute_us() + 1.0) << "request " << i;
    }
    std::vector<double> med;
    for (auto& v : us) {
      std::sort(v.begin(), v.end());
      med.push_back(v.empty() ? 0.0 : v[v.size() / 2]);
    }
    return med;
  };
  const std::vector<double> replayed = medians(true);
  Restart({"--lanes=1", "--graph_cache=0"});
  ASSERT_TRUE(client().PutTensor("A", RandomFloats({1024, 2048}, rng_), true).ok());
  ASSERT_TRUE(client().PutTensor("B", RandomFloats({2048, 1024}, rng_), true).ok());
  ASSERT_TRUE(client().PutTensor("X", RandomFloats({8192, 4096}, rng_), true).ok());
  const std::vector<double> direct = medians(false);
  ASSERT_EQ(replayed.size(), 3u);
  ASSERT_EQ(direct.size(), 3u);
  // The two large kernels (the matmul, the 128 MiB row_sum) agree; events also time the host's
  // launch when a node is queued alone, hence the room above.
  for (int n : {0, 2}) {
    EXPECT_GT(replayed[n], 0.7 * direct[n]) << ids[n] << ": replayed " << replayed[n] << " us, direct " << direct[n];
    EXPECT_LT(replayed[n], 1.3 * direct[n] + 2.0) << ids[n] << ": replayed " << replayed[n] << " us, direct " << direct[n];
  }
  // The small row_mean (4 MiB) takes a fraction of either.
  EXPECT_LT(replayed[1], 0.5 * replayed[2]) << "row_mean " << replayed[1] << " us, row_sum " << replayed[2];
  EXPECT_LT(replayed[2], replayed[0]) << "row_sum " << replayed[2] << " us, matmul " << replayed[0];
}

// --graph_cache=N keeps N graphs per execution context and evicts the least recently used:
// with one context and room for two, a third signature pushes out the one used longest ago,
// which must then be captured again, while the one used since stays and replays.
TEST_F(GpuReplayTest, TheCacheKeepsItsMostRecentlyUsedGraphs) {
  Restart({"--lanes=1", "--lane_contexts=1", "--graph_cache=2"});
  // Three signatures: row_mean over three shapes, each on its own stored tensor.
  std::vector<client::HostTensor> xs;
  std::vector<v1::ExecuteRequest> graphs;
  for (int rows : {3, 4, 5}) {
    const std::string name = "X" + std::to_string(rows);
    xs.push_back(RandomFloats({rows, 300}, rng_));
    ASSERT_TRUE(client().PutTensor(name, xs.back(), true).ok());
    v1::ExecuteRequest& g = graphs.emplace_back();
    AddNode(g, "m", "row_mean", {Stored(name)}, "auto");
    AddOutput(g, "m", true);
  }
  // (graph, captured anew): 0 and 1 fill the cache; 0 is used again, so 2 evicts 1; 0 stays;
  // 1 comes back captured (evicting 2, the least recently used by then), 2 too.
  const std::vector<std::pair<int, bool>> steps = {
      {0, true}, {1, true}, {0, false}, {2, true}, {0, false}, {1, true}, {2, true}, {1, false}};
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto [g, captured] = steps[i];
    SCOPED_TRACE("step " + std::to_string(i) + ", graph " + std::to_string(g));
    auto resp = client().Execute(graphs[g]);
    ASSERT_TRUE(resp.ok()) << resp.status();
    if (captured) {
      EXPECT_EQ(resp->graph(), v1::GRAPH_CAPTURED) << v1::GraphReplay_Name(resp->graph());
    } else {
      EXPECT_TRUE(resp->graph() == v1::GRAPH_REPLAYED || resp->graph() == v1::GRAPH_REBOUND)
          << v1::GraphReplay_Name(resp->graph());
    }
    // And the right numbers, whichever graph ran.
    const client::HostTensor& x = xs[g];
    ASSERT_EQ(resp->outputs(0).tensor().data().size(), x.shape[0] * sizeof(float));
    const float* got = reinterpret_cast<const float*>(resp->outputs(0).tensor().data().data());
    const float* v = reinterpret_cast<const float*>(x.data.data());
    for (int64_t r = 0; r < x.shape[0]; ++r) {
      double want = 0;
      for (int64_t c = 0; c < x.shape[1]; ++c) want += v[r * x.shape[1] + c];
      EXPECT_NEAR(got[r], want / static_cast<double>(x.shape[1]), 1e-5) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace opserve::e2e
