// opserve-bench's row reductions. row_mean: FLOAT32 rows from 10x2048 to 16x16777216 and one
// BFLOAT16 8192x8192, against CUB's segmented sum over the same rows (then scaled) and the read
// stream over the same bytes. row_sum INT32 -> INT64 (exact), informational (no target): the
// table against CUB's segmented reduce with an int64 accumulator and the read stream.
// row_max / row_min (the row kernels under another operator), informational: FLOAT32 at
// 10x2048, 1048576x64 and 8192x8192 and BFLOAT16 at 8192x8192, against the read stream, each
// output checked bit for bit against the table's cub_segmented row (block_per_row for bf16).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_device.h"
#include "bench/harness.h"

namespace opserve::bench {
namespace {

// The "vs stream" column: the row's GB/s against the run's 4 GiB read stream.
std::function<void(Row&)> VsStream(const Report& rep) {
  return [&rep](Row& r) {
    r.anchor2 = "read_stream";
    r.ratio2 = rep.stream_gbps > 0 ? r.gbps / rep.stream_gbps : 0;
  };
}

// The targets of one BFLOAT16 row_mean shape: auto, and block_per_row when auto chose another
// kernel, against CUB's segmented reduce over the same bf16 rows with a float32 accumulator and
// against the read stream over the same bytes, both timed in the same group.
void Bf16RowMeanTargets(Report& rep, const std::string& shape) {
  const Row* auto_row = FindAuto(rep, "row_mean", shape, "BFLOAT16");
  const Row* block_row = Find(rep, "row_mean", shape, "BFLOAT16", "block_per_row");
  const Row* cub = Find(rep, "row_mean", shape, "BFLOAT16", "cub_segmented_sum");
  const Row* stream = Find(rep, "row_mean", shape, "BFLOAT16", "read_stream_same_bytes");
  std::vector<std::pair<std::string, const Row*>> rows;
  if (auto_row != nullptr) rows.push_back({"auto", auto_row});
  if (block_row != nullptr && (auto_row == nullptr || auto_row->algorithm != "auto->block_per_row")) {
    rows.push_back({"block_per_row", block_row});
  }
  const std::string what = absl::StrCat("row_mean ", shape, " BFLOAT16: ");
  for (const auto& [name, r] : rows) {
    if (cub != nullptr && cub->median_us > 0 && r->median_us > 0) {
      const double ratio = cub->median_us / r->median_us;
      const std::string label = absl::StrCat(what, name, " >= 1.00x CUB segmented (f32 acc)");
      if (r->algorithm == "auto->cub_segmented" && ratio < 1.0 && ratio >= 0.99) {
        // auto runs CUB's own segmented reduce on the same inputs: a tie, as for FLOAT32.
        TargetCheck t{label, absl::StrFormat("%s %.3fx: CUB's own kernel", r->algorithm, ratio),
                      false};
        t.tie = true;
        rep.targets.push_back(t);
      } else {
        AddTarget(rep, label,
                  absl::StrFormat("%s %.3fx (%.1f vs %.1f us)", r->algorithm, ratio, r->median_us,
                                  cub->median_us),
                  ratio >= 1.0);
      }
    }
    if (stream != nullptr && stream->median_us > 0 && r->median_us > 0) {
      const double ratio = stream->median_us / r->median_us;
      AddTarget(rep, absl::StrCat(what, name, " >= 0.90x read stream (same bytes)"),
                absl::StrFormat("%s %.3fx (%.0f GB/s)", r->algorithm, ratio, r->gbps),
                ratio >= 0.90);
    }
  }
  // FLOAT32 ran at this shape but BFLOAT16 did not: the table does not serve it (yet).
  if (rows.empty() && FindAuto(rep, "row_mean", shape, "FLOAT32") != nullptr) {
    AddTarget(rep, absl::StrCat(what, "auto >= 1.00x CUB segmented (f32 acc)"),
              "not measured: no cuda row_mean of the op table takes BFLOAT16", false);
  }
}

// row_max and row_min (see the top of the file), from RowSumCases.
void RowExtremumCases(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t rows, cols;
    DType dtype;
  };
  const std::vector<S> shapes = {{10, 2048, DType::kFloat32},
                                 {1048576, 64, DType::kFloat32},
                                 {8192, 8192, DType::kFloat32},
                                 {8192, 8192, DType::kBFloat16}};
  for (const char* op : {"row_max", "row_min"}) {
    for (const S& s : shapes) {
      const std::string label = absl::StrCat(s.rows, "x", s.cols);
      if (!bench.WantShape(label)) continue;
      std::optional<Case> served =
          bench.CaseIfServed(op, {TensorMeta{s.dtype, {s.rows, s.cols}}}, label);
      if (!served) continue;
      const Case& c = *served;
      Sets sets(c.inputs, c.output, stream);
      // The anchor of the bits: cub_segmented where it runs the dtype, else block_per_row.
      const AlgoSpec* cub = nullptr;
      for (const char* name : {"cub_segmented", "block_per_row"}) {
        const AlgoSpec* a = FindAlgorithm(op, name, bench.backend());
        if (a != nullptr && std::find(a->dtypes.begin(), a->dtypes.end(), s.dtype) != a->dtypes.end()) {
          cub = a;
          break;
        }
      }
      if (cub == nullptr) Die(absl::StrCat(op, ": no cub_segmented or block_per_row row runs it"));
      const uint64_t bytes = c.output.Bytes();
      std::vector<char> want(bytes), got(bytes);
      if (!bench.RunTable(*cub, c, sets, 0)) Die(absl::StrCat(op, ": ", cub->name, " failed"));
      bench.FinishEnv();
      Check(cudaMemcpy(want.data(), sets.out(0), bytes, cudaMemcpyDeviceToHost), "reference");
      auto check = [&](Row& r) {
        Check(cudaMemcpy(got.data(), sets.out(0), bytes, cudaMemcpyDeviceToHost), "output");
        r.error_ok = got == want;  // exact: every row gives the same bits
        r.error = r.error_ok ? 0.0 : 1.0;
      };
      bench.RunTableAlgorithms(c, sets, {bench.ReadStreamAnchor(c, sets)}, nullptr, check,
                               VsStream(bench.report()));
    }
  }
}

}  // namespace

void RowMeanCases(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t rows, cols;
    DType dtype;
  };
  const std::vector<S> shapes = {
      {10, 2048, DType::kFloat32},    {10, 8192, DType::kFloat32},
      {1, 1048576, DType::kFloat32},  {4096, 4096, DType::kFloat32},
      {8192, 8192, DType::kFloat32},  {1048576, 64, DType::kFloat32},
      {65536, 4096, DType::kFloat32}, {16, 16777216, DType::kFloat32},
      {8192, 8192, DType::kBFloat16}};
  for (const S& s : shapes) {
    const std::string label = absl::StrCat(s.rows, "x", s.cols);
    if (!bench.WantShape(label)) continue;
    const std::vector<TensorMeta> in = {TensorMeta{s.dtype, {s.rows, s.cols}}};
    std::optional<Case> served = s.dtype == DType::kFloat32
                                     ? MakeCase("row_mean", in, label)
                                     : bench.CaseIfServed("row_mean", in, label);
    if (!served) continue;
    const Case& c = *served;
    Sets sets(c.inputs, c.output, stream);
    // CUB's segmented sum over the same rows; BFLOAT16 in a float32 accumulator, as the op's.
    auto segmented = [&](void* temp, size_t* tb, const void* rows_in, void* out) {
      if (s.dtype == DType::kBFloat16) {
        return CubSegmentedSum(temp, tb, static_cast<const uint16_t*>(rows_in),
                               static_cast<float*>(out), s.rows, s.cols, stream);
      }
      return CubSegmentedSum(temp, tb, static_cast<const float*>(rows_in),
                             static_cast<float*>(out), s.rows, s.cols, stream);
    };
    size_t temp_bytes = 0;
    Check(segmented(nullptr, &temp_bytes, nullptr, nullptr), "cub segmented size");
    DeviceMem temp(temp_bytes);
    DeviceMem ref(s.rows * sizeof(float));
    auto anchor = [&](int set, void* out) {
      size_t tb = temp_bytes;
      return segmented(temp.get(), &tb, sets.in(0, set), out) == cudaSuccess;
    };
    // The read stream over exactly this input: what any kernel can reach at this size
    // (launch, ramp-up and drain included). For FLOAT32 shown for reference (ratios use the
    // 4 GiB ceiling); BFLOAT16's target is against it.
    const std::vector<AnchorSpec> anchors = {
        {"cub_segmented_sum", [&](int set) { return anchor(set, sets.out(set)); }},
        bench.ReadStreamAnchor(c, sets)};
    anchor(0, ref.get());
    Check(ScaleInPlace(reinterpret_cast<float*>(ref.get()), s.rows, 1.0f / s.cols, stream), "scale");
    auto check = [&](Row& r) {
      Check(RelativeError(static_cast<const float*>(sets.out(0)),
                          reinterpret_cast<const float*>(ref.get()), s.rows, &r.error, stream),
            "error");
      r.error_ok = r.error < 1e-4;
    };
    bench.RunTableAlgorithms(c, sets, anchors, nullptr, check, VsStream(bench.report()));
  }
}

void RowSumCases(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t rows, cols;
  };
  const std::vector<S> shapes = {{8192, 8192}};
  for (const S& s : shapes) {
    const std::string label = absl::StrCat(s.rows, "x", s.cols);
    if (!bench.WantShape(label)) continue;
    std::optional<Case> served =
        bench.CaseIfServed("row_sum", {TensorMeta{DType::kInt32, {s.rows, s.cols}}}, label);
    if (!served) continue;
    const Case& c = *served;
    Sets sets(c.inputs, c.output, stream);
    size_t temp_bytes = 0;
    Check(CubSegmentedSum(nullptr, &temp_bytes, static_cast<const int32_t*>(nullptr),
                          static_cast<int64_t*>(nullptr), s.rows, s.cols, stream),
          "cub segmented size");
    DeviceMem temp(temp_bytes);
    DeviceMem ref(s.rows * sizeof(int64_t));
    auto anchor = [&](int set, void* out) {
      size_t tb = temp_bytes;
      return CubSegmentedSum(temp.get(), &tb, static_cast<const int32_t*>(sets.in(0, set)),
                             static_cast<int64_t*>(out), s.rows, s.cols, stream) == cudaSuccess;
    };
    const std::vector<AnchorSpec> anchors = {
        {"cub_segmented_sum", [&](int set) { return anchor(set, sets.out(set)); }},
        bench.ReadStreamAnchor(c, sets)};
    anchor(0, ref.get());
    auto check = [&](Row& r) {
      uint64_t bad = 0;
      Check(Mismatches64(static_cast<const uint64_t*>(sets.out(0)),
                         reinterpret_cast<const uint64_t*>(ref.get()), s.rows, &bad, stream),
            "row_sum check");
      r.error = static_cast<double>(bad);
      r.error_ok = bad == 0;
    };
    bench.RunTableAlgorithms(c, sets, anchors, nullptr, check, VsStream(bench.report()));
  }
  RowExtremumCases(bench);
}

void RowReduceTargets(Report& rep) {
  // The fastest any read in this run moved bytes (sum, row_mean and the read stream count bytes
  // read): with the empty kernel's time, it bounds what a row_mean of a given size can reach.
  double best_read_gbps = 0;
  for (const Row& r : rep.rows) {
    if (r.op == "sum" || r.op == "row_mean" || r.algorithm == "read_stream") {
      best_read_gbps = std::max(best_read_gbps, r.gbps);
    }
  }
  for (const Row& r : rep.rows) {
    if (r.op != "row_mean" || r.dtype != "FLOAT32" || r.algorithm.rfind("auto->", 0) != 0) continue;
    // A tie: within 1% of 1 (the noise of one kernel timed twice), anchor and row both timed.
    const Row* anchor = Find(rep, "row_mean", r.shape, r.dtype, "cub_segmented_sum");
    if (r.algorithm == "auto->cub_segmented" && r.ratio < 1.0 && r.ratio >= 0.99 &&
        anchor != nullptr && anchor->reps > 0 && r.reps > 0) {
      // The anchor is cub::DeviceSegmentedReduce::Sum and so is this row, on the same inputs.
      TargetCheck t{absl::StrCat("row_mean ", r.shape, ": auto >= 1.00x CUB segmented"),
                    absl::StrFormat("%s %.3fx: CUB's own kernel", r.algorithm, r.ratio), false};
      t.tie = true;
      rep.targets.push_back(t);
    } else {
      AddTarget(rep, absl::StrCat("row_mean ", r.shape, ": auto >= 1.00x CUB segmented"),
                absl::StrFormat("%s %.3fx", r.algorithm, r.ratio), r.ratio >= 1.0);
    }
    if (r.bytes >= (64ull << 20)) {
      std::string bound;
      if (best_read_gbps > 0 && rep.floor_us > 0 && rep.stream_gbps > 0) {
        // Time >= the empty kernel + the bytes at the best read rate of the run.
        const double min_us = rep.floor_us + r.bytes / (best_read_gbps * 1e3);
        const double reach = r.bytes / (min_us * 1e3) / rep.stream_gbps;
        if (reach < 0.90) {
          bound = absl::StrFormat("; bound %.3fx = empty kernel %.2f us + bytes at %.0f GB/s",
                                  reach, rep.floor_us, best_read_gbps);
        }
      }
      AddTarget(rep, absl::StrCat("row_mean ", r.shape, ": auto >= 0.90x read stream"),
                absl::StrFormat("%.3fx (%.0f GB/s)%s", r.ratio2, r.gbps, bound), r.ratio2 >= 0.90);
    }
    if (r.shape == "10x2048") {
      AddTarget(rep, "row_mean 10x2048: auto <= 6 us", absl::StrFormat("%.2f us", r.median_us),
                r.median_us <= 6.0);
    }
  }
  Bf16RowMeanTargets(rep, "8192x8192");
}

}  // namespace opserve::bench
