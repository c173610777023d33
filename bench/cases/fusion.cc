// opserve-bench's fusion cases (--ops=fusion): each fused kernel of the planner (FusionRules(),
// server/ops/fusion.cc) timed in one interleaved group with the node-by-node pair it replaces,
// both as the planner would run them (`auto` rows), and with the read stream over the same
// input:
//   - row_mean(transpose(X)), FLOAT32 8192^2 and 65536 x 4096: fused:col_mean against
//     transpose + row_mean; target >= 0.90x the read stream;
//   - transpose(matmul(A, B)) at 4096^3, FLOAT32 and BFLOAT16: fused:matmul_t against
//     matmul + transpose;
//   - the demo graph row_mean(transpose(matmul(A, B))) at 4096^3: matmul + fused:col_mean
//     against matmul + transpose + row_mean.
// Each fused output is checked against its unfused pair's once, before the timing.
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_device.h"
#include "bench/harness.h"
#include "kernels/matmul.h"
#include "kernels/col_reduce_tuning.h"

namespace opserve::bench {
namespace {

// One node as the planner would run it: its row, inputs and output.
struct Step {
  const AlgoSpec* algo;
  std::vector<TensorMeta> in;
  TensorMeta out;
};

const AlgoSpec* Auto(Bench& bench, absl::string_view op, const std::vector<TensorMeta>& in) {
  auto a = ResolveAlgorithm(*FindOp(op), in, "auto", bench.backend());
  if (!a.ok()) Die(std::string(a.status().message()));
  return *a;
}

const FusionRule& Rule(absl::string_view name) {
  for (const FusionRule& r : FusionRules()) {
    if (r.name == name) return r;
  }
  Die(absl::StrCat("no fusion rule ", name));
}

const AlgoSpec* Fused(Bench& bench, absl::string_view rule, const std::vector<TensorMeta>& in,
                      const TensorMeta& out) {
  const AlgoSpec* a = FusedKernel(Rule(rule), in, out, bench.backend());
  if (a == nullptr) Die(absl::StrCat(rule, ": no kernel on this device"));
  return a;
}

bool RunStep(Bench& bench, const Step& s, const std::vector<const void*>& in, void* out) {
  AttrMap attrs;
  KernelArgs args{in, s.in, out, s.out, attrs, bench.env()};
  const absl::Status st = s.algo->run(args);
  if (!st.ok()) std::fprintf(stderr, "opserve-bench: %s: %s\n", std::string(s.algo->name).c_str(),
                             std::string(st.message()).c_str());
  return st.ok();
}

// A chain of steps over one case's input set: step k reads the case inputs named by `reads`
// (input indices, or -1 - j for step j's output) and writes its buffer; the last step writes
// `out`.
struct Chain {
  std::string label;
  std::vector<Step> steps;
  std::vector<std::vector<int>> reads;
  std::vector<std::unique_ptr<DeviceMem>> buffers;  // one per step but the last

  void Allocate() {
    for (size_t k = 0; k + 1 < steps.size(); ++k) {
      buffers.push_back(std::make_unique<DeviceMem>(steps[k].out.Bytes()));
    }
  }
  bool Run(Bench& bench, Sets& sets, int set, void* out) const {
    for (size_t k = 0; k < steps.size(); ++k) {
      std::vector<const void*> in;
      for (int r : reads[k]) in.push_back(r >= 0 ? sets.in(r, set) : buffers[-1 - r]->get());
      void* dst = k + 1 == steps.size() ? out : buffers[k]->get();
      if (!RunStep(bench, steps[k], in, dst)) return false;
    }
    return true;
  }
  std::string Algorithms() const {
    std::string s;
    for (const Step& st : steps) absl::StrAppend(&s, s.empty() ? "" : "+", st.algo->name);
    return s;
  }
};

// Times the fused and unfused chains (and the read stream over input 0, when asked) in one
// group; their rows go to the report, with the fused row's ratio against the unfused and its
// ratio2 against the stream.
void TimePair(Bench& bench, const std::string& op, const std::string& shape,
              const std::vector<TensorMeta>& inputs, const TensorMeta& output, Cost fused_cost,
              Chain& fused, Chain& unfused, bool with_stream) {
  const cudaStream_t stream = bench.stream();
  Sets sets(inputs, output, stream);
  fused.Allocate();
  unfused.Allocate();
  // The check: both chains once on set 0, fused into the set's output, unfused beside it.
  DeviceMem want(output.Bytes());
  const bool ran = fused.Run(bench, sets, 0, sets.out(0)) && unfused.Run(bench, sets, 0, want.get());
  bench.FinishEnv();
  double error = -1;
  if (ran) {
    Check(RelativeError(static_cast<const float*>(sets.out(0)), reinterpret_cast<const float*>(want.get()),
                        output.NumElements(), &error, stream),
          "fusion check");
  }
  std::vector<Timed> entries;
  entries.push_back({[&](int set) { return fused.Run(bench, sets, set, sets.out(set)); },
                     [&] { bench.FinishEnv(); }, {}});
  entries.push_back({[&](int set) { return unfused.Run(bench, sets, set, sets.out(set)); },
                     [&] { bench.FinishEnv(); }, {}});
  // The harness's read stream over input 0 (it reads only the case's inputs).
  const AnchorSpec read_stream = bench.ReadStreamAnchor(Case{.inputs = inputs}, sets);
  const uint64_t stream_bytes = read_stream.bytes;
  if (with_stream) entries.push_back({read_stream.run, {}, {}});
  TimeGroup(stream, sets, bench.opt().reps, entries);

  auto row = [&](const std::string& algorithm, const Stats& st, uint64_t bytes, uint64_t flops) {
    Row r;
    r.op = op;
    r.shape = shape;
    r.dtype = std::string(DTypeName(inputs[0].dtype));
    r.algorithm = algorithm;
    r.bytes = bytes;
    r.flops = flops;
    SetRowStats(r, st);
    return r;
  };
  Row u = row(unfused.Algorithms(), entries[1].st, fused_cost.bytes, fused_cost.flops);
  u.is_anchor = true;
  u.anchor = "-";
  u.ratio = 1.0;
  Row f = row(fused.Algorithms(), entries[0].st, fused_cost.bytes, fused_cost.flops);
  f.anchor = "unfused";
  f.ratio = f.median_us > 0 ? u.median_us / f.median_us : 0;
  f.error = error;
  f.error_ok = ran && error >= 0 && error < 1e-5;
  bench.report().rows.push_back(u);
  PrintRow(u);
  if (with_stream) {
    Row s = row("read_stream_same_bytes", entries[2].st, stream_bytes, 0);
    s.is_anchor = true;
    s.anchor = "-";
    s.ratio = 1.0;
    f.anchor2 = "read_stream";
    f.ratio2 = f.median_us > 0 ? s.median_us / f.median_us : 0;
    bench.report().rows.push_back(s);
    PrintRow(s);
  }
  bench.report().rows.push_back(f);
  PrintRow(f);
}

absl::Status TransposedSgemm(const KernelArgs& a) {
  const int64_t m = a.input_meta[0].shape[0], k = a.input_meta[0].shape[1];
  const int64_t n = a.input_meta[1].shape[1];
  const cudaError_t err = kernels::MatmulCublasTransposed(
      a.env.blas_handle(), static_cast<const float*>(a.inputs[0]),
      static_cast<const float*>(a.inputs[1]), static_cast<float*>(a.output), m, n, k,
      static_cast<cudaStream_t>(a.env.stream()));
  return err == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(err));
}
const AlgoSpec kTransposedSgemm{.op = "transpose", .name = "cublas_tt_sgemm(not fused)",
                                .backend = "cuda", .run = TransposedSgemm};

}  // namespace

void FusionCases(Bench& bench) {
  const DType f32 = DType::kFloat32;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8192, 8192}, {65536, 4096}}) {
    const std::string shape = absl::StrCat(rows, "x", cols);
    if (!bench.WantShape(shape)) continue;
    const TensorMeta x{f32, {rows, cols}}, xt{f32, {cols, rows}}, out{f32, {cols}};
    Chain fused{"fused", {{Fused(bench, "fused:col_mean", {x}, out), {x}, out}}, {{0}}, {}};
    Chain unfused{"unfused",
                  {{Auto(bench, "transpose", {x}), {x}, xt}, {Auto(bench, "row_mean", {xt}), {xt}, out}},
                  {{0}, {-1}},
                  {}};
    TimePair(bench, "row_mean(transpose)", shape, {x}, out, {x.Bytes() + out.Bytes(), 0}, fused,
             unfused, /*with_stream=*/true);
  }
  const int64_t n = 4096;
  const std::string cube = absl::StrCat(n, "^3");
  if (!bench.WantShape(cube)) return;
  const TensorMeta a{f32, {n, n}}, b{f32, {n, n}}, c{f32, {n, n}}, vec{f32, {n}};
  const AlgoSpec* mm = Auto(bench, "matmul", {a, b});
  const uint64_t gemm_flops = 2ull * n * n * n;
  for (DType d : {f32, DType::kBFloat16}) {  // transpose(matmul(A, B))
    const TensorMeta ad{d, {n, n}}, bd{d, {n, n}};
    // FLOAT32 has no CUDA row (the planner keeps it two kernels): its transposed GEMM is timed
    // anyway, to show why.
    const std::vector<TensorMeta> abd = {ad, bd};
    const AlgoSpec* tt = FusedKernel(Rule("fused:matmul_t"), abd, c, bench.backend());
    Chain fused{"fused", {{tt != nullptr ? tt : &kTransposedSgemm, {ad, bd}, c}}, {{0, 1}}, {}};
    Chain unfused{"unfused",
                  {{Auto(bench, "matmul", {ad, bd}), {ad, bd}, c}, {Auto(bench, "transpose", {c}), {c}, c}},
                  {{0, 1}, {-1}},
                  {}};
    TimePair(bench, "transpose(matmul)", cube, {ad, bd}, c,
             {ad.Bytes() + bd.Bytes() + c.Bytes(), gemm_flops}, fused, unfused, false);
  }
  {  // row_mean(transpose(matmul(A, B))): the planner fuses the last two nodes.
    Chain fused{"fused",
                {{mm, {a, b}, c}, {Fused(bench, "fused:col_mean", {c}, vec), {c}, vec}},
                {{0, 1}, {-1}},
                {}};
    Chain unfused{"unfused",
                  {{mm, {a, b}, c},
                   {Auto(bench, "transpose", {c}), {c}, c},
                   {Auto(bench, "row_mean", {c}), {c}, vec}},
                  {{0, 1}, {-1}, {-2}},
                  {}};
    TimePair(bench, "row_mean(transpose(matmul))", cube, {a, b}, vec,
             {a.Bytes() + b.Bytes() + vec.Bytes(), gemm_flops + c.NumElements()}, fused, unfused,
             false);
  }
}

void ColReduceSweep(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  std::vector<kernels::ColReduceTuning> tunings;
  for (int blocks : {2, 4, 8}) {
    for (int vecs : {1, 2, 4}) {
      for (int unroll : vecs == 4 ? std::vector<int>{2, 4, 8} : std::vector<int>{4, 8, 16}) {
        tunings.push_back({vecs, unroll, blocks});
      }
    }
  }
  const kernels::ColReduceTuning def = kernels::ColReduceDefaultTuning();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8192, 8192}, {65536, 4096}, {4096, 4096}}) {
    const std::string shape = absl::StrCat(rows, "x", cols);
    const TensorMeta x{DType::kFloat32, {rows, cols}}, out{DType::kFloat32, {cols}};
    Sets sets({x}, out, stream);
    size_t most = 0;
    for (const auto& t : tunings) {
      size_t b = 0;
      Check(kernels::ColReduceTuned(t, nullptr, &b, nullptr, nullptr, rows, cols, true, stream), "size");
      most = std::max(most, b);
    }
    DeviceMem temp(most);
    std::vector<Timed> entries;
    for (const auto& t : tunings) {
      entries.push_back({[&, t](int set) {
                           size_t b = most;
                           return kernels::ColReduceTuned(t, temp.get(), &b,
                                                          static_cast<const float*>(sets.in(0, set)),
                                                          static_cast<float*>(sets.out(set)), rows,
                                                          cols, true, stream) == cudaSuccess;
                         },
                         {}, {}});
    }
    entries.push_back({bench.ReadStreamAnchor(Case{.inputs = {x}}, sets).run, {}, {}});
    TimeGroup(stream, sets, bench.opt().reps, entries);
    const double stream_us = entries.back().st.median_us;
    for (size_t i = 0; i < tunings.size(); ++i) {
      const auto& t = tunings[i];
      Row r;
      r.op = "col_sweep";
      r.shape = shape;
      r.dtype = "FLOAT32";
      r.algorithm = absl::StrFormat("v%d_u%d_b%d%s", t.vecs, t.unroll, t.blocks_per_sm,
                                    t.vecs == def.vecs && t.unroll == def.unroll &&
                                            t.blocks_per_sm == def.blocks_per_sm
                                        ? "_default"
                                        : "");
      r.bytes = x.Bytes() + out.Bytes();
      SetRowStats(r, entries[i].st);
      r.anchor2 = "read_stream";
      r.ratio2 = r.median_us > 0 ? stream_us / r.median_us : 0;
      r.ratio = r.ratio2;
      bench.report().rows.push_back(r);
      PrintRow(r);
    }
  }
}

void FusionTargets(Report& rep) {
  for (const Row& r : rep.rows) {
    if (r.anchor != "unfused" || !absl::StrContains(r.algorithm, "fused:")) continue;
    if (r.op == "row_mean(transpose)") {
      AddTarget(rep, absl::StrCat("fusion: row_mean(transpose(X)) ", r.shape, " fused >= 0.90x read stream"),
                absl::StrFormat("%s %.3fx (%.0f GB/s; %.2fx the unfused pair)", r.algorithm, r.ratio2,
                                r.gbps, r.ratio),
                r.ratio2 >= 0.90 && r.error_ok);
    } else {
      AddTarget(rep, absl::StrCat("fusion: ", r.op, " ", r.shape, " ", r.dtype, " fused not slower than unfused"),
                absl::StrFormat("%s %.1f us, %.3fx the unfused pair", r.algorithm, r.median_us, r.ratio),
                r.ratio >= 1.0 && r.error_ok);
    }
  }
}

}  // namespace opserve::bench
