// opserve-bench's matmul cases: 1024^3, 4096^3, 8192^3 and a ragged 4095x4097x1023 (--quick:
// 4096^3), FLOAT32 and BFLOAT16; every table row and `auto` against cuBLAS of the same precision
// on the same matrices (pedantic FP32 SGEMM, TF32 for the tensor-core rows on FLOAT32, BF16).
// And --ops=cublas_handles: the same bf16 GemmEx through several cuBLAS handles.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_device.h"
#include "bench/harness.h"

namespace opserve::bench {

void MatmulCases(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t m, n, k;
  };
  std::vector<S> shapes = {{1024, 1024, 1024}, {4096, 4096, 4096}, {8192, 8192, 8192},
                           {4095, 4097, 1023}};
  if (bench.opt().quick) shapes = {{4096, 4096, 4096}};
  for (const S& s : shapes) {
    const std::string label = absl::StrCat(s.m, "x", s.n, "x", s.k);
    if (!bench.WantShape(label)) continue;
    for (DType d : {DType::kFloat32, DType::kBFloat16}) {
      Case c = MakeCase("matmul", {TensorMeta{d, {s.m, s.k}}, TensorMeta{d, {s.k, s.n}}}, label);
      Sets sets(c.inputs, c.output, stream);
      DeviceMem ref(s.m * s.n * sizeof(float));
      auto gemm = [&](Blas::Precision p, int set, void* out) {
        return bench.blas().Gemm(p, sets.in(0, set), sets.in(1, set), static_cast<float*>(out),
                                 s.m, s.n, s.k) == cudaSuccess;
      };
      const Blas::Precision main_p =
          d == DType::kBFloat16 ? Blas::Precision::kBf16 : Blas::Precision::kFp32Pedantic;
      std::vector<AnchorSpec> anchors = {
          {d == DType::kBFloat16 ? "cublas_bf16" : "cublas_sgemm_pedantic",
           [&](int set) { return gemm(main_p, set, sets.out(set)); }}};
      if (d == DType::kFloat32) {
        anchors.push_back({"cublas_tf32",
                           [&](int set) { return gemm(Blas::Precision::kTf32, set, sets.out(set)); },
                           0, "TF32"});
      }
      gemm(main_p, 0, ref.get());
      auto check = [&](Row& r) {
        Check(RelativeError(static_cast<const float*>(sets.out(0)),
                            reinterpret_cast<const float*>(ref.get()), s.m * s.n, &r.error, stream),
              "error");
        r.error_ok = r.error < (r.dtype == "TF32" ? 5e-3 : 1e-3);
      };
      bench.RunTableAlgorithms(c, sets, anchors, nullptr, check, {}, d == DType::kFloat32 ? 1 : -1);
    }
  }
}

// Why the table's cuBLAS row (the server's handle) ran 14% slower than the bf16 anchor (the
// benchmark's handle) at 8192^3 (H200, 2026-11-22: 1645 vs 1445 us; no gap at 4096^3). The same
// GemmEx through: the benchmark's handle; the table row (server handle, dlopen'ed cuBLAS,
// MatmulCublas); the server handle through the linked cuBLAS; a fresh handle; a fresh handle
// with a 32 MiB workspace of its own; and the table's tensor_core_sm90a (the wgmma + TMA kernel)
// for scale. First interleaved run by run
// (order rotated each round), so clock drift hits every variant alike; then each in a block of
// runs, as the table times them. After every run a probe reads the SM clock: a gap that follows
// the order and the clock, not the handle, is the GPU clocking down under a long GEMM.
void CublasHandles(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t m, n, k;
  };
  const S shapes[] = {{8192, 8192, 8192}, {4096, 4096, 4096}};
  const AlgoSpec* table_cublas = nullptr;
  const AlgoSpec* table_tc = nullptr;
  for (const AlgoSpec* a : AlgorithmsFor("matmul", bench.backend())) {
    if (a->backend != "cuda") continue;
    if (a->name == "cublas") table_cublas = a;
    if (a->name == "tensor_core_sm90a") table_tc = a;
  }
  if (table_cublas == nullptr || table_tc == nullptr) {
    Die("no cuda cublas / tensor_core_sm90a rows in the op table");
  }
  constexpr size_t kWorkspace = 32u << 20;  // NVIDIA's recommendation for Hopper
  void* ws_none = nullptr;
  void* ws_32 = nullptr;
  void* fresh = CreateBlasHandle(stream, 0, &ws_none);
  void* fresh_ws = CreateBlasHandle(stream, kWorkspace, &ws_32);
  if (fresh == nullptr || fresh_ws == nullptr) Die("cuBLAS: fresh handles");
  for (const S& s : shapes) {
    const std::string label = absl::StrCat(s.m, "x", s.n, "x", s.k);
    if (!bench.WantShape(label)) continue;
    Case c = MakeCase("matmul", {TensorMeta{DType::kBFloat16, {s.m, s.k}},
                                 TensorMeta{DType::kBFloat16, {s.k, s.n}}},
                      label);
    Sets sets(c.inputs, c.output, stream);
    struct Variant {
      std::string name;
      std::function<bool(int)> run;
    };
    auto direct = [&](void* h) {
      return [&, h](int set) {
        return GemmBf16OnHandle(h, sets.in(0, set), sets.in(1, set),
                                static_cast<float*>(sets.out(set)), s.m, s.n, s.k) == cudaSuccess;
      };
    };
    const std::vector<Variant> variants = {
        {"bench_handle", [&](int set) {
           return bench.blas().Gemm(Blas::Precision::kBf16, sets.in(0, set), sets.in(1, set),
                             static_cast<float*>(sets.out(set)), s.m, s.n, s.k) == cudaSuccess;
         }},
        {"table_row_server_handle", [&](int set) { return bench.RunTable(*table_cublas, c, sets, set); }},
        {"server_handle_linked", direct(bench.env().blas_handle())},
        {"fresh_handle", direct(fresh)},
        {"fresh_handle_ws32MiB", direct(fresh_ws)},
        {"table_tensor_core_sm90a", [&](int set) { return bench.RunTable(*table_tc, c, sets, set); }},
    };
    const int nv = static_cast<int>(variants.size());
    if (nv != 6) Die("cublas_handles: the blocked order below lists 6 variants");
    const int rounds = bench.opt().reps;
    DeviceMem mhz(sizeof(float) * nv * rounds * 2);
    float* d_mhz = reinterpret_cast<float*>(mhz.get());
    constexpr int64_t kProbeNs = 50 * 1000;
    // One timed run of variant v into slot `slot`; returns false on failure.
    std::vector<cudaEvent_t> ev(2 * nv * rounds * 2);
    for (cudaEvent_t& e : ev) Check(cudaEventCreate(&e), "cudaEventCreate");
    auto timed = [&](int v, int slot) {
      Check(Spin(kSpinNs, stream), "spin");
      Check(cudaEventRecord(ev[2 * slot], stream), "event");
      const bool ok = variants[v].run(sets.Next());
      Check(cudaEventRecord(ev[2 * slot + 1], stream), "event");
      Check(ClockProbe(d_mhz + slot, kProbeNs, stream), "clock probe");
      return ok;
    };
    // Warm-up: every variant twice (handles' first-call setup, heuristics caches).
    for (int w = 0; w < 2; ++w) {
      for (int v = 0; v < nv; ++v) {
        if (!variants[v].run(sets.Next())) Die(absl::StrCat("cublas_handles: ", variants[v].name));
      }
    }
    bench.FinishEnv();
    // slot = phase * nv * rounds + v * rounds + r
    bool ok = true;
    for (int r = 0; r < rounds && ok; ++r) {  // interleaved, order rotated every round
      for (int i = 0; i < nv && ok; ++i) {
        const int v = (r + i) % nv;
        ok = timed(v, v * rounds + r);
      }
    }
    // Blocked, as the table runs them: the tensor-core row first, then the table's cuBLAS row
    // right after it (the table's order), then the rest.
    const int blocked_order[] = {5, 1, 0, 2, 3, 4};
    static_assert(std::size(blocked_order) == 6, "one entry per variant");
    for (int v : blocked_order) {
      for (int r = 0; r < rounds && ok; ++r) ok = timed(v, nv * rounds + v * rounds + r);
    }
    bench.FinishEnv();
    if (!ok) Die("cublas_handles: a run failed");
    std::vector<float> h_mhz(nv * rounds * 2);
    Check(cudaMemcpy(h_mhz.data(), d_mhz, h_mhz.size() * sizeof(float), cudaMemcpyDeviceToHost),
          "read clocks");
    std::printf("cublas_handles %s BFLOAT16 (%d rounds; us median / min, SM MHz median after "
                "each run)\n",
                label.c_str(), rounds);
    for (int phase = 0; phase < 2; ++phase) {
      for (int v = 0; v < nv; ++v) {
        std::vector<double> us, clk;
        for (int r = 0; r < rounds; ++r) {
          const int slot = phase * nv * rounds + v * rounds + r;
          float ms = 0;
          Check(cudaEventElapsedTime(&ms, ev[2 * slot], ev[2 * slot + 1]), "elapsed");
          us.push_back(ms * 1e3);
          clk.push_back(h_mhz[slot]);
        }
        const Stats st = StatsOf(us);
        const double mhz = StatsOf(clk).median_us;  // the median of the clocks, in MHz
        Row row;
        row.op = "cublas_handles";
        row.shape = label;
        row.dtype = "BFLOAT16";
        row.algorithm = absl::StrCat(phase == 0 ? "interleaved:" : "blocked:", variants[v].name);
        row.reps = rounds;
        row.median_us = st.median_us;
        row.min_us = st.min_us;
        row.flops = c.cost.flops;
        row.bytes = c.cost.bytes;
        row.tflops = row.flops / (row.median_us * 1e-6) / 1e12;
        row.gbps = row.bytes / (row.median_us * 1e-6) / 1e9;
        row.anchor = "-";
        row.anchor2 = "sm_mhz";  // the "vs stream" column of these rows: the SM clock, MHz
        row.ratio2 = mhz;
        bench.report().rows.push_back(row);
        std::printf("  %-36s %9.1f / %9.1f us %7.1f TFLOP/s  %6.0f MHz\n", row.algorithm.c_str(),
                    row.median_us, row.min_us, row.tflops, mhz);
      }
    }
    std::fflush(stdout);
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  }
  DestroyBlasHandle(fresh, ws_none);
  DestroyBlasHandle(fresh_ws, ws_32);
}

void MatmulTargets(Report& rep) {
  if (const Row* r = Find(rep, "matmul", "4096x4096x4096", "FLOAT32", "block_tiled_vectorized")) {
    AddTarget(rep, "matmul 4096^3: block_tiled_vectorized >= 0.60x cuBLAS SGEMM",
              absl::StrFormat("%.3fx (%.1f TFLOP/s)", r->ratio, r->tflops), r->ratio >= 0.60);
  }
  // The hand-matmul targets: the hand-written FP32 kernel against cuBLAS's pedantic SGEMM, and the ragged
  // shape's rate against the multiple-size one.
  for (auto [shape, bar] : {std::pair<const char*, double>{"1024x1024x1024", 0.80},
                            {"4096x4096x4096", 0.90}, {"8192x8192x8192", 0.90}}) {
    if (const Row* r = Find(rep, "matmul", shape, "FLOAT32", "warp_tiled")) {
      AddTarget(rep, absl::StrFormat("matmul %s: warp_tiled >= %.2fx cuBLAS SGEMM", shape, bar),
                absl::StrFormat("%.3fx (%.1f TFLOP/s)", r->ratio, r->tflops), r->ratio >= bar);
    }
  }
  const Row* ragged = Find(rep, "matmul", "4095x4097x1023", "FLOAT32", "warp_tiled");
  const Row* whole = Find(rep, "matmul", "4096x4096x4096", "FLOAT32", "warp_tiled");
  if (ragged != nullptr && whole != nullptr && whole->tflops > 0) {
    AddTarget(rep, "matmul 4095x4097x1023: warp_tiled >= 0.80x its 4096^3 rate",
              absl::StrFormat("%.3fx (%.1f vs %.1f TFLOP/s)", ragged->tflops / whole->tflops,
                              ragged->tflops, whole->tflops),
              ragged->tflops >= 0.80 * whole->tflops);
  }
  for (auto [shape, row_dtype, bar] :
       {std::tuple<const char*, const char*, double>{"4096x4096x4096", "TF32", 0.90},
        {"8192x8192x8192", "TF32", 0.90}, {"8192x8192x8192", "BFLOAT16", 1.0}}) {
    if (const Row* r = Find(rep, "matmul", shape, row_dtype, "tensor_core_sm90a")) {
      AddTarget(rep, absl::StrFormat("matmul %s: tensor_core_sm90a %s >= %.2fx cuBLAS", shape,
                                     row_dtype, bar),
                absl::StrFormat("%.3fx (%.1f TFLOP/s)", r->ratio, r->tflops), r->ratio >= bar);
    }
  }
  // The cuBLAS targets were set for, and measured on, the wgmma + TMA kernel: the table's
  // tensor_core_sm90a row (tensor_core is the mma.sync kernel alone).
  struct TensorCoreTarget {
    const char* row_dtype;   // the row's dtype: FLOAT32 inputs are labelled TF32
    const char* precision;   // as the label names it
    const char* case_dtype;  // the case's input dtype
  };
  for (const TensorCoreTarget& t : {TensorCoreTarget{"TF32", "TF32", "FLOAT32"},
                                    TensorCoreTarget{"BFLOAT16", "BF16", "BFLOAT16"}}) {
    const std::string what = absl::StrCat("matmul 4096^3: tensor_core_sm90a ", t.precision,
                                          " >= 0.50x cuBLAS ", t.precision);
    bool case_ran = false;  // its cuBLAS anchor has a row
    for (const Row& r : rep.rows) {
      case_ran = case_ran || (r.op == "matmul" && r.shape == "4096x4096x4096" && r.is_anchor &&
                              r.dtype == t.case_dtype);
    }
    if (const Row* r = Find(rep, "matmul", "4096x4096x4096", t.row_dtype, "tensor_core_sm90a")) {
      AddTarget(rep, what, absl::StrFormat("%.3fx (%.1f TFLOP/s)", r->ratio, r->tflops),
                r->ratio >= 0.50);
    } else if (case_ran) {
      AddTarget(rep, what, "not measured: no tensor_core_sm90a row in the op table", false);
    }
  }
}

}  // namespace opserve::bench
