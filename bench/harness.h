// The harness of opserve-bench, shared by the case files (bench/cases/*.cc): the timing method
// (timing.cc), the ceilings and the loop over the op table's rows (harness.cc), and what a case
// file exports to the entry point (bench_main.cc, which also holds the CLI flags).
//
// Method (as every figure in PERFORMANCE.md is taken):
//   - CUDA events around each run, after warm-up; the median of >= 20 runs is reported.
//   - Each run is preceded by a ~100 us spin kernel on the same stream, so the host queues the
//     run while the GPU is busy: the events see the device's work (every launch of a multi-launch
//     algorithm and the gaps between them) but not the host's launch overhead.
//   - Inputs rotate through enough sets that every run reads memory the last runs did not touch
//     (at least 256 MiB in all, several times the 50-60 MB L2); every set holds fresh random
//     values (never zeros), drawn with a new seed each run.
//   - GB/s counts the op's Cost (each input read once, the output written once); TFLOP/s 2MNK.
//   - Each algorithm's output is checked once against its anchor's, so a fast wrong kernel shows.
//   - The rows of one case (its anchors, every algorithm, auto) are timed interleaved, run by run
//     in a rotating order, so clock drift over a case reaches them alike (TimeGroup).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/engine/backend.h"
#include "server/ops/op.h"
#include "server/ops/tensor.h"
#include "bench/bench.h"
#include "bench/ceilings.h"

namespace opserve::bench {

constexpr uint64_t kMinRotatedBytes = 256ull << 20;  // several times the 50-60 MB L2
constexpr int kMaxSets = 4096;
constexpr int kMinReps = 20;
constexpr int kDefaultReps = 30;
constexpr int kWarmups = 3;
constexpr int64_t kSpinNs = 100 * 1000;  // longer than any launcher's host work seen
constexpr double kSlowRunMs = 150.0;     // runs slower than this get kMinReps and one warm-up
constexpr uint64_t kAlign = 256;         // the pool's alignment; sets start on it
constexpr uint64_t kCopyBytes = 4ull << 30;    // the D2D ceiling copies 4 GiB
constexpr uint64_t kStreamBytes = 4ull << 30;  // the read stream reads 4 GiB a run, 2 sets

struct Options {
  // --ops=; without it (bench_main.cc) every op of the table, "fusion" and "service".
  std::set<std::string> ops;
  bool quick = false;
  std::string out_dir;
  int reps = kDefaultReps;
  std::set<std::string> algos;   // empty: all
  std::set<std::string> shapes;  // empty: all
  std::string opserve_bin;
  int64_t chunk_bytes = 0;  // --chunk_bytes: the service path's transfer chunk (0: default)
  std::vector<std::string> server_args;  // --server_arg=X (repeatable): appended to opserve's
  bool transpose_sweep = false;  // time TransposeTma's knobs instead of the table
  bool sweep_one_tile = false;   // --sweep_one_tile: only the one-tile-per-CTA settings + default
  // The load section's grid (--load_lanes, --load_conc, --load_workloads, --load_seconds); empty
  // or 0: the section's own defaults (concurrency_bench.h).
  std::vector<int> load_lanes, load_conc;
  std::set<std::string> load_workloads;  // "10x2048", "4096x4096", ...
  double load_seconds = 0;
  int load_rounds = 0;
  int load_channels = 1;  // ConcurrencyOptions::channels
  uint64_t http_mib = 1024;  // HttpOptions::shm_mib
  // --load_variant=LABEL:ARG,ARG (repeatable): servers compared in the same windows.
  std::vector<std::pair<std::string, std::vector<std::string>>> load_variants;
};

// ---- The timing method (timing.cc). ----

// Prints "opserve-bench: WHAT" on stderr and exits with status 2.
[[noreturn]] void Die(const std::string& what);
// Die with the CUDA error's name and text when err is not cudaSuccess.
void Check(cudaError_t err, const char* what);

// A device allocation owned by the benchmark (outside the server's budget).
class DeviceMem {
 public:
  explicit DeviceMem(uint64_t bytes);
  ~DeviceMem();
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  char* get() const { return static_cast<char*>(p_); }
  uint64_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  uint64_t bytes_;
};

// `bytes` of fresh random values of `dtype` (bench_device.h says which), a new seed each call.
void Fill(void* d, DType dtype, uint64_t bytes, cudaStream_t s);

// Input and output sets of one case, rotated run by run.
class Sets {
 public:
  Sets(const std::vector<TensorMeta>& inputs, const TensorMeta& output, cudaStream_t s);
  int count() const { return count_; }
  void* in(size_t i, int set) const { return in_[i]->get() + in_strides_[i] * set; }
  void* out(int set) const { return out_->get() + out_stride_ * set; }
  // The set a run uses: warm-ups and timed runs walk on, so no two nearby runs share one.
  int Next() { return next_++ % count_; }

 private:
  int count_ = 2;
  std::vector<uint64_t> in_strides_;
  std::vector<std::unique_ptr<DeviceMem>> in_;
  uint64_t out_stride_ = 0;
  std::unique_ptr<DeviceMem> out_;
  int next_ = 0;
};

struct Stats {
  int reps = 0;
  double median_us = 0, min_us = 0, p90_us = 0;
};

// Median, min and p90 of a batch of run times (microseconds).
Stats StatsOf(std::vector<double> us);

// Times `run(set)` per the method above: the warm-up, then max_reps timed runs, or kMinReps
// when a run takes kSlowRunMs or more.
Stats TimeRuns(cudaStream_t s, Sets& sets, int max_reps, const std::function<bool(int)>& run,
               const std::function<void()>& after_batch);

// One entry of an interleaved group: a run and what to do after each batch of it.
struct Timed {
  std::function<bool(int)> run;
  std::function<void()> after;
  Stats st;
};

// Times a group of entries the way TimeRuns times one, but interleaved: after each entry's
// warm-up, `max_reps` rounds run every entry once, in an order rotated each round, so a clock
// that drifts over the group (sustained tensor-core GEMMs lower it; PERFORMANCE.md) reaches every
// entry alike. Entries of kSlowRunMs or more are timed on their own (kMinReps, blocked):
// interleaving a 2 s teaching kernel would only stretch the group.
void TimeGroup(cudaStream_t s, Sets& sets, int max_reps, std::vector<Timed>& entries);

// ---- Cases and the op table's rows (harness.cc). ----

// One benchmark case: an op on given input metas.
struct Case {
  const OpSpec* op;
  std::vector<TensorMeta> inputs;
  TensorMeta output;
  std::string shape;
  std::string dtype;
  Cost cost;
};

// The case of op `op_name` on `inputs`, labelled `shape`; dies when the op rejects them.
Case MakeCase(absl::string_view op_name, std::vector<TensorMeta> inputs, std::string shape);

// A timed anchor of a case: CUB, cuBLAS or a read stream on the case's own inputs.
struct AnchorSpec {
  std::string name;
  std::function<bool(int)> run;
  uint64_t bytes = 0;  // 0: the op's Cost
  std::string dtype;   // empty: the case's
};

// What a case file works with: the server's backend and execution context (the table rows run
// exactly as they do inside opserve), the benchmark's own cuBLAS handles, the options, and the
// report its rows go to.
class Bench {
 public:
  Bench(Options opt, Backend* backend, ExecEnv* env);

  const Options& opt() const { return opt_; }
  Backend& backend() { return *backend_; }
  ExecEnv& env() { return *env_; }
  cudaStream_t stream() const { return stream_; }
  Blas& blas() { return blas_; }
  Report& report() { return report_; }

  // The D2D copy, the read stream and the empty kernel: the run's ceilings and floor, measured
  // first, into report().copy_gbps, stream_gbps and floor_us.
  void Ceilings();

  bool WantShape(const std::string& label) const;
  bool WantAlgo(const std::string& name) const;

  // A case whose dtype the op table may not serve yet: the case, or nothing (with a line saying
  // why) when the op rejects the dtype or no "cuda" row of the table takes it.
  std::optional<Case> CaseIfServed(absl::string_view op_name, std::vector<TensorMeta> inputs,
                                   const std::string& shape);

  // The read stream over exactly the case's input bytes (a whole number of float4s here).
  AnchorSpec ReadStreamAnchor(const Case& c, Sets& sets);
  // A ceiling used as a bandwidth anchor (no timing of its own in this case).
  static Row CeilingAnchor(std::string name, double gbps);

  // One run of table row `a` on input set `set`; false (with a line on stderr) when it fails.
  bool RunTable(const AlgoSpec& a, const Case& c, Sets& sets, int set);
  // Waits for the execution context's work; dies on an error.
  void FinishEnv();

  // Every "cuda" row of the table for this op and dtype, then `auto`, timed in one interleaved
  // group with the case's anchors (TimeGroup). The ratio's reference is anchors[0], or `fixed`
  // (by GB/s: transpose's copy ceiling) when there are no timed anchors; anchors[tf32] (when >= 0)
  // is the reference of the tensor-core rows on FLOAT32, which compute in TF32.
  void RunTableAlgorithms(const Case& c, Sets& sets, const std::vector<AnchorSpec>& anchors,
                          const Row* fixed, const std::function<void(Row&)>& check,
                          const std::function<void(Row&)>& extra, int tf32 = -1);

 private:
  Row CeilingRow(std::string name, std::string shape, std::string dtype, const Stats& st,
                 uint64_t bytes, uint64_t flops);
  Row AnchorRowFrom(const Case& c, const AnchorSpec& spec, const Stats& st);

  Options opt_;
  Backend* backend_;
  ExecEnv* env_;
  cudaStream_t stream_;
  Blas blas_;
  Report report_;
};

// ---- Reading the rows back, for the targets (harness.cc). ----

// The row of op, shape, dtype and algorithm; nullptr when the run has none.
const Row* Find(const Report& rep, const std::string& op, const std::string& shape,
                const std::string& dtype, const std::string& algo);
// The `auto->...` row of op, shape and dtype; nullptr when the run has none.
const Row* FindAuto(const Report& rep, const std::string& op, const std::string& shape,
                    const std::string& dtype);
// Appends a target check that holds or misses (not a tie).
void AddTarget(Report& rep, std::string what, std::string measured, bool holds);
// A row's timing from `st`, and its GB/s and TFLOP/s from its bytes and flops.
void SetRowStats(Row& r, const Stats& st);
// The row as the console table prints it.
void PrintRow(const Row& r);

// ---- The case files: each op's shapes, anchors, output checks and targets. ----

// bench/cases/sum.cc
void SumCases(Bench& bench);
void SumTargets(Report& rep);
// bench/cases/row_reduce.cc
void RowMeanCases(Bench& bench);
void RowSumCases(Bench& bench);
void RowReduceTargets(Report& rep);
// bench/cases/transpose.cc
void TransposeCases(Bench& bench);
void TransposeSweep(Bench& bench, const std::string& dir);
void TransposeTargets(Report& rep);
// bench/cases/fusion.cc: the planner's fused kernels against the pairs they replace.
void FusionCases(Bench& bench);
// --ops=col_sweep: the column reduction's knobs (kernels/col_reduce_tuning.h) against the read
// stream, FLOAT32 column means at 8192^2, 65536 x 4096 and 4096^2.
void ColReduceSweep(Bench& bench);
void FusionTargets(Report& rep);
// bench/cases/matmul.cc
void MatmulCases(Bench& bench);
void CublasHandles(Bench& bench);
void MatmulTargets(Report& rep);
// bench/cases/table.cc: an op of the table without a case file, from its test model alone.
void TableCases(Bench& bench, const OpSpec& op);

}  // namespace opserve::bench
