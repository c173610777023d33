#include "bench/replay_bench.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/service_process.h"

namespace opserve::bench {
namespace {

v1::ExecuteRequest DemoGraph() {
  v1::ExecuteRequest req;
  auto add = [&](const char* id, const char* op, std::vector<std::pair<bool, const char*>> ins) {
    v1::Node* node = req.add_nodes();
    node->set_id(id);
    node->set_op(op);
    node->set_algorithm("auto");
    for (const auto& [stored, name] : ins) {
      if (stored) node->add_inputs()->set_stored(name); else node->add_inputs()->set_node(name);
    }
  };
  add("ab", "matmul", {{true, "replay_a"}, {true, "replay_b"}});
  add("abt", "transpose", {{false, "ab"}});
  add("mean", "row_mean", {{false, "abt"}});
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("mean");
  out->set_return_inline(true);
  return req;
}

std::string RunMode(const ReplayOptions& opt, ReplayMode* mode) {
  std::vector<std::string> args = opt.server_args;
  args.push_back("--lanes=1");
  args.push_back(absl::StrCat("--graph_cache=", mode->graph_cache));
  Session session;
  if (std::string err = session.Open(opt.opserve_bin, args); !err.empty()) return err;
  client::Client& c = *session.client;
  const int64_t shape[] = {opt.n, opt.n};
  for (const char* name : {"replay_a", "replay_b"}) {
    const std::string x = RandomFloats(static_cast<uint64_t>(opt.n * opt.n));
    auto put = c.PutTensor(name, v1::FLOAT32, shape, x.data(), x.size(), /*overwrite=*/true);
    if (!put.ok()) return absl::StrCat("PutTensor ", name, ": ", put.status().message());
  }
  const v1::ExecuteRequest req = DemoGraph();
  std::vector<double> compute, kernels, overhead, total;
  std::vector<std::vector<double>> per_kernel;
  for (int i = 0; i < 30 + opt.requests; ++i) {
    const auto t0 = Clock::now();
    auto resp = c.Execute(req);
    const double us = Us(Clock::now() - t0);
    if (!resp.ok()) return absl::StrCat("Execute: ", resp.status().ToString());
    if (i < 30) continue;  // warm: the first capture, the channel, the pool
    // A fused pair reports its one kernel on both nodes: counted where fused_into is empty.
    double sum = 0;
    size_t k = 0;
    for (const v1::NodeResult& r : resp->nodes()) {
      if (!r.fused_into().empty()) continue;
      sum += r.kernel_us();
      if (per_kernel.size() <= k) per_kernel.resize(k + 1);
      per_kernel[k++].push_back(r.kernel_us());
    }
    compute.push_back(resp->timing().compute_us());
    kernels.push_back(sum);
    overhead.push_back(resp->timing().compute_us() - sum);
    total.push_back(us);
    mode->replayed += resp->graph() == v1::GRAPH_REPLAYED;
    mode->rebound += resp->graph() == v1::GRAPH_REBOUND;
  }
  mode->requests = opt.requests;
  mode->compute_p50_us = Percentile(compute, 0.5);
  mode->kernels_p50_us = Percentile(kernels, 0.5);
  mode->overhead_p50_us = Percentile(overhead, 0.5);
  for (const std::vector<double>& us : per_kernel) mode->kernel_p50_us.push_back(Percentile(us, 0.5));
  mode->total_p50_us = Percentile(total, 0.5);
  return "";
}

}  // namespace

ReplayFigures RunReplayBench(const ReplayOptions& opt) {
  ReplayFigures f;
  for (const auto& [name, cache] : std::vector<std::pair<std::string, int>>{
           {"replayed", 64}, {"node by node", 0}}) {
    ReplayMode mode{.name = name, .graph_cache = cache};
    if (std::string err = RunMode(opt, &mode); !err.empty()) {
      f.error = absl::StrCat(name, ": ", err);
      return f;
    }
    f.modes.push_back(mode);
  }
  f.floor = MeasureGraphFloor(f.modes.front().kernel_p50_us, opt.requests);
  f.ran = true;
  return f;
}

void PrintReplay(const ReplayFigures& f) {
  if (!f.ran) {
    std::printf("\ngraph replay: not measured: %s\n", f.error.c_str());
    return;
  }
  std::printf("\ngraph replay: row_mean(transpose(matmul(A, B))) at 1024^3, stored inputs, one "
              "lane, one client (medians):\n");
  std::printf("  %-14s %12s %16s %12s %12s\n", "mode", "compute us", "sum kernel us",
              "overhead us", "client us");
  for (const ReplayMode& m : f.modes) {
    std::printf("  %-14s %12.1f %16.1f %12.1f %12.1f   (%d of %d replayed, %d rebound; kernels",
                m.name.c_str(), m.compute_p50_us, m.kernels_p50_us, m.overhead_p50_us,
                m.total_p50_us, m.replayed, m.requests, m.rebound);
    for (double us : m.kernel_p50_us) std::printf(" %.1f", us);
    std::printf(" us)\n");
  }
  std::printf("  (overhead: compute_us less the kernels' sum, per request; each fused kernel once)\n");
  const GraphFloor& g = f.floor;
  if (!g.ran) {
    std::printf("  CUDA floor: not measured: %s\n", g.error.c_str());
    return;
  }
  std::printf("  CUDA floor, a graph of the replayed kernels' lengths and the server's marks, "
              "launched by the bench:\n    launch to seen %.1f us, stamped span %.1f us, "
              "overhead %.1f us (per launch, medians)\n",
              g.seen_p50_us, g.span_p50_us, g.overhead_p50_us);
}

void AddReplayTargets(const ReplayFigures& f, Report& rep) {
  if (!f.ran || f.modes.empty()) return;
  const ReplayMode& m = f.modes.front();
  const std::string floor =
      f.floor.ran ? absl::StrFormat("; CUDA floor of the same graph %.1f us", f.floor.overhead_p50_us)
                  : std::string();
  AddTarget(rep, "replay: demo graph 1024^3 compute_us <= sum of kernel_us + 5 us",
            absl::StrFormat("%.1f us over the kernels per request (%.1f vs %.1f us; %d of %d "
                            "replayed, %d rebound%s)",
                            m.overhead_p50_us, m.compute_p50_us, m.kernels_p50_us, m.replayed,
                            m.requests, m.rebound, floor),
            m.replayed + m.rebound == m.requests && m.overhead_p50_us <= 5.0);
}

}  // namespace opserve::bench
