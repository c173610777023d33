// The harness's side of a case (harness.h): the run's ceilings, the loop over the op table's
// "cuda" rows and `auto` against a case's anchors, the rows it records and prints, and reading
// those rows back for the targets.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_device.h"
#include "bench/harness.h"

namespace opserve::bench {
namespace {

void SetStats(Row& r, const Stats& st) {
  r.reps = st.reps;
  r.median_us = st.median_us;
  r.min_us = st.min_us;
  r.p90_us = st.p90_us;
  if (st.median_us > 0) {
    r.gbps = r.bytes / (st.median_us * 1e-6) / 1e9;
    r.tflops = r.flops / (st.median_us * 1e-6) / 1e12;
  }
}

void Print(const Row& r) {
  std::printf("  %-9s %-15s %-8s %-26s %10.1f us %8.1f GB/s %7.2f TF/s  ratio %.3f %s\n",
              r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.algorithm.c_str(), r.median_us,
              r.gbps, r.tflops, r.ratio, r.error_ok ? "" : "  OUTPUT CHECK FAILED");
  std::fflush(stdout);
}

}  // namespace

void SetRowStats(Row& r, const Stats& st) { SetStats(r, st); }
void PrintRow(const Row& r) { Print(r); }

Case MakeCase(absl::string_view op_name, std::vector<TensorMeta> inputs, std::string shape) {
  Case c;
  c.op = FindOp(op_name);
  if (c.op == nullptr) Die(absl::StrCat("no op ", op_name));
  c.inputs = std::move(inputs);
  auto out = c.op->infer(c.inputs);
  if (!out.ok()) Die(std::string(out.status().message()));
  c.output = *out;
  c.shape = std::move(shape);
  c.dtype = std::string(DTypeName(c.inputs[0].dtype));
  c.cost = c.op->cost(c.inputs, c.output);
  return c;
}

Bench::Bench(Options opt, Backend* backend, ExecEnv* env)
    : opt_(std::move(opt)), backend_(backend), env_(env),
      stream_(static_cast<cudaStream_t>(env->stream())) {
  Check(blas_.Init(stream_), "cuBLAS init");
}

void Bench::Ceilings() {
  {  // Device-to-device copy: 4 GiB each way, alternating direction.
    auto a = std::make_unique<DeviceMem>(kCopyBytes), b = std::make_unique<DeviceMem>(kCopyBytes);
    Fill(a->get(), DType::kFloat32, kCopyBytes, stream_);
    Fill(b->get(), DType::kFloat32, kCopyBytes, stream_);
    Sets dummy({}, TensorMeta{DType::kFloat32, {1}}, stream_);
    Stats st = TimeRuns(
        stream_, dummy, opt_.reps,
        [&](int set) {
          const bool fwd = set % 2 == 0;
          return CopyD2D(fwd ? b->get() : a->get(), fwd ? a->get() : b->get(), kCopyBytes,
                         stream_) == cudaSuccess;
        },
        [] {});
    Row r = CeilingRow("d2d_copy", "4GiB", "bytes", st, 2 * kCopyBytes, 0);
    report_.copy_gbps = r.gbps;
    report_.rows.push_back(r);
  }
  {  // float4 read-only stream: 4 GiB a run, two sets.
    TensorMeta m{DType::kFloat32, {static_cast<int64_t>(kStreamBytes / 4)}};
    Sets sets({m}, TensorMeta{DType::kFloat32, {1}}, stream_);
    Stats st = TimeRuns(
        stream_, sets, opt_.reps,
        [&](int set) {
          return ReadStream(static_cast<const float*>(sets.in(0, set)), kStreamBytes / 4,
                            static_cast<float*>(sets.out(set)), stream_) == cudaSuccess;
        },
        [] {});
    Row r = CeilingRow("read_stream", "4GiB", "FLOAT32", st, kStreamBytes, 0);
    report_.stream_gbps = r.gbps;
    report_.rows.push_back(r);
  }
  {  // The method's floor: an empty one-warp kernel, timed like every run.
    Sets dummy({}, TensorMeta{DType::kFloat32, {1}}, stream_);
    Stats st = TimeRuns(
        stream_, dummy, opt_.reps, [&](int) { return EmptyKernel(stream_) == cudaSuccess; }, [] {});
    Row r = CeilingRow("empty_kernel", "1x32", "-", st, 0, 0);
    report_.floor_us = r.median_us;
    report_.rows.push_back(r);
  }
}

bool Bench::WantShape(const std::string& label) const {
  return opt_.shapes.empty() || opt_.shapes.count(label) > 0;
}

bool Bench::WantAlgo(const std::string& name) const {
  return opt_.algos.empty() || opt_.algos.count(name) > 0;
}

std::optional<Case> Bench::CaseIfServed(absl::string_view op_name, std::vector<TensorMeta> inputs,
                                        const std::string& shape) {
  const OpSpec* op = FindOp(op_name);
  if (op == nullptr) Die(absl::StrCat("no op ", op_name));
  const std::string dtype(DTypeName(inputs[0].dtype));
  auto out = op->infer(inputs);
  if (!out.ok()) {
    std::printf("  %-9s %-15s %-8s skipped: %s\n", std::string(op_name).c_str(), shape.c_str(),
                dtype.c_str(), std::string(out.status().message()).c_str());
    return std::nullopt;
  }
  bool served = false;
  for (const AlgoSpec* a : AlgorithmsFor(op_name, *backend_)) {
    served = served || (a->backend == "cuda" &&
                        std::find(a->dtypes.begin(), a->dtypes.end(), inputs[0].dtype) !=
                            a->dtypes.end());
  }
  if (!served) {
    std::printf("  %-9s %-15s %-8s skipped: no cuda algorithm of the op table takes it\n",
                std::string(op_name).c_str(), shape.c_str(), dtype.c_str());
    return std::nullopt;
  }
  return MakeCase(op_name, std::move(inputs), shape);
}

Row Bench::CeilingRow(std::string name, std::string shape, std::string dtype, const Stats& st,
                      uint64_t bytes, uint64_t flops) {
  Row r;
  r.op = "ceiling";
  r.shape = std::move(shape);
  r.dtype = std::move(dtype);
  r.algorithm = std::move(name);
  r.is_anchor = true;
  r.bytes = bytes;
  r.flops = flops;
  SetStats(r, st);
  r.anchor = "-";
  r.ratio = 1.0;
  Print(r);
  return r;
}

Row Bench::CeilingAnchor(std::string name, double gbps) {
  Row r;
  r.algorithm = std::move(name);
  r.gbps = gbps;
  r.is_anchor = true;
  return r;
}

AnchorSpec Bench::ReadStreamAnchor(const Case& c, Sets& sets) {
  const uint64_t bytes = c.inputs[0].Bytes();
  return {"read_stream_same_bytes",
          [this, &sets, bytes](int set) {
            return ReadStream(static_cast<const float*>(sets.in(0, set)),
                              static_cast<int64_t>(bytes / 4), static_cast<float*>(sets.out(set)),
                              stream_) == cudaSuccess;
          },
          bytes};
}

Row Bench::AnchorRowFrom(const Case& c, const AnchorSpec& spec, const Stats& st) {
  Row r;
  r.op = std::string(c.op->name);
  r.shape = c.shape;
  r.dtype = spec.dtype.empty() ? c.dtype : spec.dtype;
  r.algorithm = spec.name;
  r.is_anchor = true;
  r.bytes = spec.bytes > 0 ? spec.bytes : c.cost.bytes;
  r.flops = c.op->name == "matmul" ? c.cost.flops : 0;
  SetStats(r, st);
  r.anchor = "-";
  r.ratio = 1.0;
  return r;
}

bool Bench::RunTable(const AlgoSpec& a, const Case& c, Sets& sets, int set) {
  std::vector<const void*> ptrs;
  for (size_t i = 0; i < c.inputs.size(); ++i) ptrs.push_back(sets.in(i, set));
  AttrMap attrs;
  KernelArgs args{ptrs, c.inputs, sets.out(set), c.output, attrs, *env_};
  absl::Status st = a.run(args);
  if (!st.ok()) {
    std::fprintf(stderr, "opserve-bench: %s %s %s: %s\n", std::string(a.op).c_str(),
                 std::string(a.name).c_str(), c.shape.c_str(), std::string(st.message()).c_str());
    return false;
  }
  return true;
}

void Bench::FinishEnv() {
  auto done = env_->Finish(0);
  if (!done.ok()) Die(std::string(done.status().message()));
}

void Bench::RunTableAlgorithms(const Case& c, Sets& sets, const std::vector<AnchorSpec>& anchors,
                               const Row* fixed, const std::function<void(Row&)>& check,
                               const std::function<void(Row&)>& extra, int tf32) {
  std::vector<const AlgoSpec*> algos;
  for (const AlgoSpec* a : AlgorithmsFor(c.op->name, *backend_)) {
    if (a->backend != "cuda") continue;
    if (std::find(a->dtypes.begin(), a->dtypes.end(), c.inputs[0].dtype) == a->dtypes.end()) {
      continue;
    }
    if (WantAlgo(std::string(a->name))) algos.push_back(a);
  }
  const AlgoSpec* auto_algo = nullptr;
  if (WantAlgo("auto")) {
    auto resolved = ResolveAlgorithm(*c.op, c.inputs, "auto", *backend_);
    if (resolved.ok()) {
      auto_algo = *resolved;
    } else {
      std::fprintf(stderr, "opserve-bench: auto for %s %s: %s\n", c.shape.c_str(),
                   c.dtype.c_str(), std::string(resolved.status().message()).c_str());
    }
  }
  std::vector<const AlgoSpec*> table = algos;
  if (auto_algo != nullptr) table.push_back(auto_algo);

  std::vector<Timed> entries;
  for (const AnchorSpec& a : anchors) entries.push_back({a.run, {}, {}});
  for (const AlgoSpec* a : table) {
    entries.push_back({[this, a, &c, &sets](int set) { return RunTable(*a, c, sets, set); },
                       [this] { FinishEnv(); }, {}});
  }
  TimeGroup(stream_, sets, opt_.reps, entries);

  std::vector<Row> anchor_rows;
  for (size_t i = 0; i < anchors.size(); ++i) {
    anchor_rows.push_back(AnchorRowFrom(c, anchors[i], entries[i].st));
    report_.rows.push_back(anchor_rows.back());
    Print(anchor_rows.back());
  }
  const Row* primary = anchors.empty() ? fixed : &anchor_rows[0];
  const Row* tf32_row = tf32 >= 0 ? &anchor_rows[tf32] : nullptr;

  std::vector<Row> done;
  for (size_t t = 0; t < table.size(); ++t) {
    const AlgoSpec& a = *table[t];
    const Stats& st = entries[anchors.size() + t].st;
    if (st.reps == 0) continue;
    const bool is_auto = t == algos.size();
    Row r;
    r.op = std::string(c.op->name);
    r.shape = c.shape;
    r.dtype = c.dtype;
    // The tensor-core rows (tensor_core, tensor_core_sm90a) on FLOAT32 inputs run TF32: label
    // them by the precision they compute in.
    const bool is_tf32 = c.op->name == "matmul" && absl::StartsWith(a.name, "tensor_core") &&
                         c.inputs[0].dtype == DType::kFloat32;
    if (is_tf32) r.dtype = "TF32";
    r.algorithm = is_auto ? absl::StrCat("auto->", a.name) : std::string(a.name);
    r.bytes = c.cost.bytes;
    r.flops = c.op->name == "matmul" ? c.cost.flops : 0;
    SetStats(r, st);
    const Row* an = is_tf32 && tf32_row != nullptr ? tf32_row : primary;
    if (an != nullptr) {
      r.anchor = an->algorithm;
      if (an->median_us > 0) {
        r.ratio = an->median_us / r.median_us;
      } else if (an->gbps > 0) {
        r.ratio = r.gbps / an->gbps;
      }
    }
    if (extra) extra(r);
    // The output check, on set 0.
    if (RunTable(a, c, sets, 0)) {
      FinishEnv();
      check(r);
    }
    if (is_auto) {  // auto against the fastest algorithm that computes in the same precision
      const Row* best = nullptr;
      for (const Row& d : done) {
        if (d.dtype != r.dtype) continue;
        if (best == nullptr || d.median_us < best->median_us) best = &d;
      }
      if (best != nullptr) {
        r.best = best->algorithm;
        r.vs_best = best->median_us / r.median_us;
      }
    }
    done.push_back(r);
    report_.rows.push_back(r);
    Print(r);
    if (is_auto && !r.best.empty()) {
      std::printf("    auto vs fastest (%s): %.3f\n", r.best.c_str(), r.vs_best);
    }
  }
}

const Row* Find(const Report& rep, const std::string& op, const std::string& shape,
                const std::string& dtype, const std::string& algo) {
  for (const Row& r : rep.rows) {
    if (r.op == op && r.shape == shape && r.dtype == dtype && r.algorithm == algo) return &r;
  }
  return nullptr;
}

const Row* FindAuto(const Report& rep, const std::string& op, const std::string& shape,
                    const std::string& dtype) {
  for (const Row& r : rep.rows) {
    if (r.op == op && r.shape == shape && r.dtype == dtype && r.algorithm.rfind("auto->", 0) == 0) {
      return &r;
    }
  }
  return nullptr;
}

void AddTarget(Report& rep, std::string what, std::string measured, bool holds) {
  rep.targets.push_back({std::move(what), std::move(measured), holds});
}

}  // namespace opserve::bench
