// opserve-bench's transpose cases: FLOAT32 4096^2 to 32768^2 and 8192x32768 (--quick: 16384^2
// and 32768^2), every table row and `auto` against the run's 4 GiB D2D copy by GB/s, each output
// checked element-wise. And --transpose-sweep: TransposeTma's knobs instead of the table.
#include <cuda_runtime_api.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_device.h"
#include "bench/harness.h"
#include "kernels/transpose.h"
#include "kernels/transpose_tma_tuning.h"

namespace opserve::bench {

void TransposeCases(Bench& bench) {
  const cudaStream_t stream = bench.stream();
  struct S {
    int64_t rows, cols;
  };
  std::vector<S> shapes = {{4096, 4096}, {16384, 16384}, {32768, 32768}, {8192, 32768}};
  if (bench.opt().quick) shapes = {{16384, 16384}, {32768, 32768}};
  for (const S& s : shapes) {
    const std::string label = absl::StrCat(s.rows, "x", s.cols);
    if (!bench.WantShape(label)) continue;
    Case c = MakeCase("transpose", {TensorMeta{DType::kFloat32, {s.rows, s.cols}}}, label);
    Sets sets(c.inputs, c.output, stream);
    Row a = Bench::CeilingAnchor("d2d_copy", bench.report().copy_gbps);
    auto check = [&](Row& r) {
      uint64_t bad = 0;
      Check(TransposeMismatches(static_cast<const uint32_t*>(sets.in(0, 0)),
                                static_cast<const uint32_t*>(sets.out(0)), s.rows, s.cols, &bad,
                                stream),
            "transpose check");
      r.error = static_cast<double>(bad);
      r.error_ok = bad == 0;
    };
    bench.RunTableAlgorithms(c, sets, {}, &a, check, {});
  }
}

// TransposeTma's knobs (kernels/transpose_tma_tuning.h) over the transpose shapes: first every
// tile shape on ragged shapes against the element-wise check, then the timings. Writes
// DIR/transpose_sweep.csv and prints each shape's fastest settings.
void TransposeSweep(Bench& bench, const std::string& dir) {
  const Options& opt = bench.opt();
  const cudaStream_t stream = bench.stream();
  const double copy_gbps = bench.report().copy_gbps;
  struct Tile {
    int rows, boxes;
    std::vector<int> ctas;
  };
  const std::vector<Tile> tiles = {{64, 2, {2, 3}}, {64, 4, {1, 2}}, {128, 2, {1, 2}}, {128, 4, {1}}};
  const int groups[] = {4, 8, 16, 32, 64};
  std::vector<kernels::TransposeTmaTuning> tunings;
  auto name = [](const kernels::TransposeTmaTuning& t) {
    return absl::StrFormat("tile%dx%d_g%s_l2%s_%s", t.tile_rows, t.boxes,
                           t.group_tile_rows <= 0 ? "col" : absl::StrCat(t.group_tile_rows),
                           t.l2_promote_256 ? "256" : "128",
                           t.one_tile_per_cta ? absl::StrCat("one", t.max_ctas_per_sm >= 4 ? "_r4" : "")
                                              : absl::StrCat("cta", t.max_ctas_per_sm));
  };
  const std::string default_name = name(kernels::TransposeTmaDefaultTuning(4));
  tunings.push_back(kernels::TransposeTmaDefaultTuning(4));
  if (!opt.sweep_one_tile) {  // the persistent settings
    for (const Tile& t : tiles) {
      for (int g : groups) {
        for (bool promo : {false, true}) {
          for (int c : t.ctas) tunings.push_back({t.rows, t.boxes, g, promo, c});
        }
      }
    }
  }
  // One tile per CTA (a grid of every tile, dispatched in tile order): tile order matters more
  // here, so row-major (group 1) and narrow groups are in.
  // max_ctas_per_sm 4 here selects register-capped builds (64x2, 32x4) where they exist.
  const std::vector<std::pair<int, int>> one_tile_shapes = {{64, 2},  {64, 4}, {128, 4}, {32, 2},
                                                            {32, 4},  {128, 2}, {256, 2}};
  // The x2 tiles of 64-256 rows also walk in long column groups, up to the whole tile column
  // (group 0, the default's order), which puts their output pieces in address order.
  auto tall = [](int rows_t, int boxes_t) { return boxes_t == 2 && rows_t >= 64; };
  for (const auto& [rows_t, boxes_t] : one_tile_shapes) {
    std::vector<int> groups_t = {1, 2, 4, 16, 64};
    if (tall(rows_t, boxes_t)) groups_t.insert(groups_t.end(), {32, 128, 256, 0});
    for (int g : groups_t) {
      for (bool promo : {false, true}) {
        for (int c : {1, 4}) {
          if (c == 4 && !((rows_t == 64 && boxes_t == 2) || (rows_t == 32 && boxes_t == 4))) continue;
          kernels::TransposeTmaTuning tu{rows_t, boxes_t, g, promo, c};
          tu.one_tile_per_cta = true;
          if (name(tu) != default_name) tunings.push_back(tu);  // the default is already in
        }
      }
    }
  }
  // Ragged shapes: every path (vector and element stores, partial boxes and tiles) of every
  // tile shape, against the element-wise check.
  // Every shape TMA can describe (rows of a 16-byte multiple); the rest run smem_tiled.
  const std::pair<int64_t, int64_t> ragged[] = {{1, 4},     {4, 4},       {65, 132},   {1000, 1004},
                                                {1001, 1004}, {3000, 8}, {129, 260},  {4096, 4100},
                                                {300, 36},  {257, 516}};
  int bad = 0;
  // The default (a whole-column walk) first, then every tile shape.
  std::vector<kernels::TransposeTmaTuning> ragged_tunings = {kernels::TransposeTmaDefaultTuning(4)};
  for (const Tile& t : tiles) ragged_tunings.push_back({t.rows, t.boxes, 8, false, t.ctas.back()});
  for (const auto& [rows_t, boxes_t] : one_tile_shapes) {
    for (int c : {1, 4}) {
      kernels::TransposeTmaTuning tu{rows_t, boxes_t, 2, true, c};
      tu.one_tile_per_cta = true;
      ragged_tunings.push_back(tu);
    }
  }
  for (const kernels::TransposeTmaTuning& tu : ragged_tunings) {
    for (const auto& [r, c] : ragged) {
      TensorMeta m{DType::kFloat32, {r, c}};
      Sets sets({m}, TensorMeta{DType::kFloat32, {c, r}}, stream);
      Check(kernels::TransposeTmaTuned(tu, sets.in(0, 0), sets.out(0), r, c, 4, stream),
            "TransposeTmaTuned");
      uint64_t mismatches = 0;
      Check(TransposeMismatches(static_cast<const uint32_t*>(sets.in(0, 0)),
                                static_cast<const uint32_t*>(sets.out(0)), r, c, &mismatches,
                                stream),
            "transpose check");
      if (mismatches) {
        ++bad;
        std::printf("  SWEEP CHECK FAILED: %s %ldx%ld: %lu wrong\n", name(tu).c_str(), long(r),
                    long(c), static_cast<unsigned long>(mismatches));
      }
    }
  }
  std::printf("transpose sweep: ragged checks of %zu tile shapes: %s\n", ragged_tunings.size(),
              bad ? "FAILED" : "all exact");
  // Every variant's output is checked element-wise on every shape after its timing (the first
  // sweep checked 16384^2 only, and one 3-CTA variant failed there once); 3-CTA variants, the
  // only ones that failed, are run and checked kRechecks more times. A failure prints its count
  // and first wrong element (tile-aligned blocks of wrong elements point at a shared-memory
  // race, a lone element at memory).
  constexpr int kRechecks = 4;
  int failed_variants = 0;
  std::string csv =
      "shape,tuning,median_us,gbps,ratio_copy,check_ok,checks,failed_checks,mismatches,"
      "first_bad_row,first_bad_col\n";
  const std::pair<int64_t, int64_t> shapes[] = {{16384, 16384}, {32768, 32768}, {8192, 32768}, {4096, 4096}};
  for (const auto& [r, c] : shapes) {
    TensorMeta m{DType::kFloat32, {r, c}};
    Sets sets({m}, TensorMeta{DType::kFloat32, {c, r}}, stream);
    const uint64_t bytes = 2 * m.Bytes();
    std::vector<std::pair<double, std::string>> results;
    for (const auto& tu : tunings) {
      Stats st = TimeRuns(
          stream, sets, opt.reps,
          [&](int set) {
            return kernels::TransposeTmaTuned(tu, sets.in(0, set), sets.out(set), r, c, 4,
                                              stream) == cudaSuccess;
          },
          [] {});
      const int checks = 1 + (tu.max_ctas_per_sm >= 3 ? kRechecks : 0);
      int failed_checks = 0;
      uint64_t worst = 0;
      int64_t first_bad = -1;
      for (int k = 0; k < checks; ++k) {
        // A fresh poison each time, so a check cannot pass on an earlier run's output.
        Check(cudaMemsetAsync(sets.out(0), 0xFF, m.Bytes(), stream), "poison");
        Check(kernels::TransposeTmaTuned(tu, sets.in(0, 0), sets.out(0), r, c, 4, stream), "run");
        uint64_t mismatches = 0;
        int64_t bad = -1;
        Check(TransposeMismatches(static_cast<const uint32_t*>(sets.in(0, 0)),
                                  static_cast<const uint32_t*>(sets.out(0)), r, c, &mismatches,
                                  stream, &bad),
              "transpose check");
        if (mismatches) {
          ++failed_checks;
          if (mismatches > worst) worst = mismatches;
          if (first_bad < 0) first_bad = bad;
          std::printf("  SWEEP CHECK FAILED: %s %ldx%ld check %d of %d: %lu wrong, first at "
                      "input (%ld, %ld)\n",
                      name(tu).c_str(), long(r), long(c), k + 1, checks,
                      static_cast<unsigned long>(mismatches), long(bad / c), long(bad % c));
        }
      }
      const bool ok = failed_checks == 0;
      if (!ok) ++failed_variants;
      const double gbps = bytes / (st.median_us * 1e-6) / 1e9;
      csv += absl::StrFormat("%ldx%ld,%s,%.2f,%.1f,%.4f,%d,%d,%d,%lu,%ld,%ld\n", long(r), long(c),
                             name(tu), st.median_us, gbps, gbps / copy_gbps, ok ? 1 : 0,
                             checks, failed_checks, static_cast<unsigned long>(worst),
                             long(first_bad < 0 ? -1 : first_bad / c),
                             long(first_bad < 0 ? -1 : first_bad % c));
      results.push_back({st.median_us, name(tu) + (ok ? "" : " CHECK FAILED")});
    }
    std::sort(results.begin(), results.end());
    std::printf("transpose sweep %ldx%ld (copy %.0f GB/s):\n", long(r), long(c), copy_gbps);
    for (size_t i = 0; i < results.size(); ++i) {
      const bool is_default = results[i].second == default_name ||
                              results[i].second.rfind(default_name + " ", 0) == 0;
      if (i < 8 || is_default) {
        const double gbps = bytes / (results[i].first * 1e-6) / 1e9;
        std::printf("  %2zu %-32s %9.1f us %7.0f GB/s %.3fx%s\n", i + 1, results[i].second.c_str(),
                    results[i].first, gbps, gbps / copy_gbps,
                    is_default ? "  (default)" : "");
      }
    }
    std::fflush(stdout);
  }
  std::printf("transpose sweep: element-wise checks of %zu variants x %zu shapes: %s\n",
              tunings.size(), std::size(shapes),
              failed_variants ? absl::StrCat(failed_variants, " variant-shapes FAILED").c_str()
                              : "all exact");
  if (!dir.empty()) {
    mkdir(dir.c_str(), 0755);
    std::ofstream(dir + "/transpose_sweep.csv") << csv;
  }
}

void TransposeTargets(Report& rep) {
  for (const char* s : {"16384x16384", "32768x32768"}) {
    const Row* best = nullptr;
    for (const Row& r : rep.rows) {
      if (r.op == "transpose" && r.shape == s && r.algorithm.rfind("auto->", 0) != 0 &&
          (best == nullptr || r.ratio > best->ratio)) {
        best = &r;
      }
    }
    if (best) {
      AddTarget(rep, absl::StrCat("transpose ", s, ": best >= 0.95x D2D copy"),
                absl::StrFormat("%s %.3fx (%.0f GB/s)", best->algorithm, best->ratio, best->gbps),
                best->ratio >= 0.95);
    }
  }
}

}  // namespace opserve::bench
