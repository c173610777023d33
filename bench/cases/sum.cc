// opserve-bench's whole-tensor reductions. sum: 2^30, 2^24 and 2^20 elements of INT32 and
// FLOAT32 (--quick: 2^30 only), plus INT64 and BFLOAT16 at 2^28 where the table serves them;
// every table row and `auto` against cub::DeviceReduce::Sum on the same inputs, in the op's
// accumulator. max and min (the same kernels under another operator): FLOAT32 and INT32 at the
// same sizes (--quick: 2^30 FLOAT32), BFLOAT16 at 2^28, every row and `auto` against the read
// stream over the same bytes, each output checked bit for bit against the table's cub row. The
// target: max's `auto` at 2^30 FLOAT32 streams at >= 0.95x sum's `auto`, both from this run.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/harness.h"

namespace opserve::bench {
namespace {

// cub::DeviceReduce::Sum over the case's input, accumulating as the op does: int32 widened to
// int64, int64 in int64 (wrapping), bf16 in float32.
cudaError_t RunCubSum(const Case& c, void* temp, size_t* temp_bytes, void* in, void* out,
                      cudaStream_t stream) {
  const int64_t n = c.inputs[0].NumElements();
  switch (c.inputs[0].dtype) {
    case DType::kInt32:
      return CubReduceSum(temp, temp_bytes, static_cast<const int32_t*>(in),
                          static_cast<int64_t*>(out), n, stream);
    case DType::kInt64:
      return CubReduceSum(temp, temp_bytes, static_cast<const int64_t*>(in),
                          static_cast<int64_t*>(out), n, stream);
    case DType::kBFloat16:
      return CubReduceSum(temp, temp_bytes, static_cast<const uint16_t*>(in),
                          static_cast<float*>(out), n, stream);
    default:
      return CubReduceSum(temp, temp_bytes, static_cast<const float*>(in),
                          static_cast<float*>(out), n, stream);
  }
}

int64_t ReadInt64(const void* dev) {
  int64_t x = 0;
  Check(cudaMemcpy(&x, dev, sizeof(x), cudaMemcpyDeviceToHost), "read scalar");
  return x;
}

void ReadScalar(DType d, const void* dev, double* v) {
  if (d == DType::kInt64) {
    int64_t x = 0;
    Check(cudaMemcpy(&x, dev, sizeof(x), cudaMemcpyDeviceToHost), "read scalar");
    *v = static_cast<double>(x);
  } else {
    float x = 0;
    Check(cudaMemcpy(&x, dev, sizeof(x), cudaMemcpyDeviceToHost), "read scalar");
    *v = x;
  }
}

// max / min (`op`) over the sizes of SumCases, checked against the table's cub row.
void ExtremumCases(Bench& bench, absl::string_view op,
                   const std::vector<std::pair<int64_t, std::string>>& sizes) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t n;
    std::string label;
    DType dtype;
  };
  std::vector<S> cases;
  for (const auto& [n, label] : sizes) {
    for (DType d : {DType::kFloat32, DType::kInt32}) {
      if (!bench.opt().quick || d == DType::kFloat32) cases.push_back({n, label, d});
    }
  }
  if (!bench.opt().quick) cases.push_back({int64_t{1} << 28, "2^28", DType::kBFloat16});
  for (const S& sc : cases) {
    if (!bench.WantShape(sc.label)) continue;
    std::optional<Case> served = bench.CaseIfServed(op, {TensorMeta{sc.dtype, {sc.n}}}, sc.label);
    if (!served) continue;
    const Case& c = *served;
    Sets sets(c.inputs, c.output, stream);
    const AlgoSpec* cub = FindAlgorithm(op, "cub", bench.backend());
    if (cub == nullptr) Die(absl::StrCat(op, ": the table has no cub row to check against"));
    const size_t bytes = ElementSize(c.output.dtype);
    char want[8] = {}, got[8] = {};
    if (!bench.RunTable(*cub, c, sets, 0)) Die(absl::StrCat(op, ": the cub row failed"));
    bench.FinishEnv();
    Check(cudaMemcpy(want, sets.out(0), bytes, cudaMemcpyDeviceToHost), "read reference");
    auto check = [&](Row& r) {
      Check(cudaMemcpy(got, sets.out(0), bytes, cudaMemcpyDeviceToHost), "read scalar");
      r.error_ok = std::memcmp(got, want, bytes) == 0;  // exact: every row gives the same bits
      r.error = r.error_ok ? 0.0 : 1.0;
    };
    bench.RunTableAlgorithms(c, sets, {bench.ReadStreamAnchor(c, sets)}, nullptr, check, {});
  }
}

}  // namespace

void SumCases(Bench& bench) {
  const Options& opt = bench.opt();
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t n;
    std::string label;
    DType dtype;
  };
  std::vector<S> cases;
  const std::vector<std::pair<int64_t, std::string>> sizes =
      opt.quick ? std::vector<std::pair<int64_t, std::string>>{{int64_t{1} << 30, "2^30"}}
                : std::vector<std::pair<int64_t, std::string>>{{int64_t{1} << 30, "2^30"},
                                                               {int64_t{1} << 24, "2^24"},
                                                               {int64_t{1} << 20, "2^20"}};
  for (const auto& [n, label] : sizes) {
    for (DType d : {DType::kInt32, DType::kFloat32}) cases.push_back({n, label, d});
  }
  // INT64 and BFLOAT16, informational (no target): 2 GiB / 512 MiB inputs, each far past L2.
  if (!opt.quick) {
    for (DType d : {DType::kInt64, DType::kBFloat16}) cases.push_back({int64_t{1} << 28, "2^28", d});
  }
  for (const S& sc : cases) {
    const int64_t n = sc.n;
    const DType d = sc.dtype;
    if (!bench.WantShape(sc.label)) continue;
    std::optional<Case> served = d == DType::kInt32 || d == DType::kFloat32
                                     ? MakeCase("sum", {TensorMeta{d, {n}}}, sc.label)
                                     : bench.CaseIfServed("sum", {TensorMeta{d, {n}}}, sc.label);
    if (!served) continue;
    const Case& c = *served;
    Sets sets(c.inputs, c.output, stream);
    // The anchor: cub::DeviceReduce::Sum in the op's accumulator (int32 widened to int64,
    // bf16 to float, as the op does).
    size_t temp_bytes = 0;
    Check(RunCubSum(c, nullptr, &temp_bytes, sets.in(0, 0), sets.out(0), stream), "cub size");
    DeviceMem temp(temp_bytes);
    DeviceMem ref(8);
    auto anchor = [&](int set, void* out) {
      size_t tb = temp_bytes;
      return RunCubSum(c, temp.get(), &tb, sets.in(0, set), out, stream) == cudaSuccess;
    };
    const std::vector<AnchorSpec> anchors = {
        {"cub_reduce", [&](int set) { return anchor(set, sets.out(set)); }}};
    anchor(0, ref.get());
    auto check = [&](Row& r) {
      if (c.output.dtype == DType::kInt64) {
        const int64_t got = ReadInt64(sets.out(0)), want = ReadInt64(ref.get());
        // INT32: relative to sum |x| (~500 n for the values drawn). INT64 sums of values drawn
        // over all 64 bits wrap, so only equality means anything there.
        r.error = d == DType::kInt32 ? std::fabs(static_cast<double>(got) -
                                                 static_cast<double>(want)) / (500.0 * n)
                                     : (got == want ? 0.0 : 1.0);
        r.error_ok = got == want;
      } else {
        double got = 0, want = 0;
        ReadScalar(c.output.dtype, sets.out(0), &got);
        ReadScalar(c.output.dtype, ref.get(), &want);
        // Relative to sum |x|, about n/2 for uniform [-1, 1) (bf16: the same values rounded).
        r.error = std::fabs(got - want) / (0.5 * n);
        r.error_ok = r.error < 1e-5;
      }
    };
    bench.RunTableAlgorithms(c, sets, anchors, nullptr, check, {});
  }
  for (const char* op : {"max", "min"}) ExtremumCases(bench, op, sizes);
}

void SumTargets(Report& rep) {
  for (const char* d : {"INT32", "FLOAT32"}) {
    const Row* best = nullptr;
    for (const Row& r : rep.rows) {
      if (r.op == "sum" && r.shape == "2^30" && r.dtype == d && !r.is_anchor &&
          r.algorithm.rfind("auto->", 0) != 0 && (best == nullptr || r.ratio > best->ratio)) {
        best = &r;
      }
    }
    if (best) {
      AddTarget(rep, absl::StrCat("sum 2^30 ", d, ": best >= 1.00x CUB"),
                absl::StrFormat("%s %.3fx (%.0f GB/s)", best->algorithm, best->ratio, best->gbps),
                best->ratio >= 1.0);
    }
  }
  // max runs the sum's kernels under another operator: it should stream as fast.
  const Row* sum = FindAuto(rep, "sum", "2^30", "FLOAT32");
  const Row* max = FindAuto(rep, "max", "2^30", "FLOAT32");
  if (sum != nullptr || max != nullptr) {
    const std::string what = "max 2^30 FLOAT32: auto >= 0.95x sum's auto GB/s (same run)";
    if (sum == nullptr || max == nullptr || sum->gbps <= 0) {
      AddTarget(rep, what, absl::StrCat("not measured: ", sum == nullptr ? "sum" : "max",
                                        " 2^30 FLOAT32 did not run"),
                false);
    } else {
      const double ratio = max->gbps / sum->gbps;
      AddTarget(rep, what,
                absl::StrFormat("%.3fx: %s %.0f GB/s vs sum %s %.0f GB/s", ratio, max->algorithm,
                                max->gbps, sum->algorithm, sum->gbps),
                ratio >= 0.95 && max->error_ok);
    }
  }
}

}  // namespace opserve::bench
