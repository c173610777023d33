// opserve-bench: every op x algorithm x dtype of the op table (its "cuda" rows, plus `auto` as
// ResolveAlgorithm resolves it), timed against the ceilings a user would otherwise reach for,
// measured in the same run: the device-to-device copy, a float4 read-only stream, CUB's reduce and
// segmented reduce, and cuBLAS SGEMM (pedantic FP32), TF32 and BF16. Optionally the service path
// over loopback gRPC (--ops=...,service). A benchmark, not a test.
//
//   opserve-bench [--ops=sum,row_mean,row_sum,transpose,matmul,service,cublas_handles] [--quick]
//                 [--out=DIR]
//                 [--reps=N] [--algos=a,b,auto] [--shapes=LABEL,...] [--opserve=PATH]
//
// Method (METHOD.md of the lent GPU machines):
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
#include <cuda_runtime_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/cuda/cuda_backend.h"
#include "server/ops.h"
#include "server/tensor.h"
#include "bench/bench.h"
#include "bench/bench_device.h"
#include "bench/ceilings.h"
#include "kernels/transpose.h"
#include "kernels/transpose_tma_tuning.h"
#if OPSERVE_BENCH_SERVICE
#include "bench/service_bench.h"
#endif

namespace opserve::bench {
namespace {

constexpr uint64_t kMinRotatedBytes = 256ull << 20;  // several times the 50-60 MB L2
constexpr int kMaxSets = 4096;
constexpr int kMinReps = 20;
constexpr int kDefaultReps = 30;
constexpr int kWarmups = 3;
constexpr int64_t kSpinNs = 100 * 1000;  // longer than any launcher's host work seen
constexpr double kSlowRunMs = 150.0;     // runs slower than this get kMinReps and one warm-up
constexpr uint64_t kAlign = 256;         // the pool's alignment; sets start on it
constexpr uint64_t kCopyBytes = 4ull << 30;    // the D2D ceiling copies 4 GiB (as GPU.md's)
constexpr uint64_t kStreamBytes = 4ull << 30;  // the read stream reads 4 GiB a run, 2 sets

struct Options {
  std::set<std::string> ops = {"sum", "row_mean", "row_sum", "transpose", "matmul", "service"};
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
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "opserve-bench: %s\n", what.c_str());
  std::exit(2);
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    Die(absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
}

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// A device allocation owned by the benchmark (outside the server's budget).
class DeviceMem {
 public:
  explicit DeviceMem(uint64_t bytes) : bytes_(bytes) {
    Check(cudaMalloc(&p_, std::max<uint64_t>(bytes, 1)), "cudaMalloc");
  }
  ~DeviceMem() { cudaFree(p_); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  char* get() const { return static_cast<char*>(p_); }
  uint64_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  uint64_t bytes_;
};

uint64_t NextSeed() {
  static std::mt19937_64 rng(std::random_device{}() ^
                             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return rng();
}

void Fill(void* d, DType dtype, uint64_t bytes, cudaStream_t s) {
  switch (dtype) {
    case DType::kFloat32:
      Check(FillRandomF32(static_cast<float*>(d), bytes / 4, NextSeed(), s), "fill");
      break;
    case DType::kInt32:
      Check(FillRandomI32(static_cast<int32_t*>(d), bytes / 4, NextSeed(), s), "fill");
      break;
    case DType::kInt64:
      Check(FillRandomI64(static_cast<int64_t*>(d), bytes / 8, NextSeed(), s), "fill");
      break;
    case DType::kBFloat16:
      Check(FillRandomBf16(static_cast<uint16_t*>(d), bytes / 2, NextSeed(), s), "fill");
      break;
    default:
      Die("no random fill for this dtype");
  }
}

// Input and output sets of one case, rotated run by run.
class Sets {
 public:
  Sets(const std::vector<TensorMeta>& inputs, const TensorMeta& output, cudaStream_t s) {
    uint64_t set_bytes = 0;
    for (const TensorMeta& m : inputs) set_bytes += AlignUp(m.Bytes());
    set_bytes += AlignUp(output.Bytes());
    count_ = static_cast<int>(std::clamp<uint64_t>((kMinRotatedBytes + set_bytes - 1) / set_bytes,
                                                   2, kMaxSets));
    for (const TensorMeta& m : inputs) {
      const uint64_t stride = AlignUp(m.Bytes());
      in_strides_.push_back(stride);
      in_.push_back(std::make_unique<DeviceMem>(stride * count_));
      Fill(in_.back()->get(), m.dtype, stride * count_, s);
    }
    out_stride_ = AlignUp(output.Bytes());
    out_ = std::make_unique<DeviceMem>(out_stride_ * count_);
    Check(cudaMemsetAsync(out_->get(), 0xFF, out_stride_ * count_, s), "poison outputs");
    Check(cudaStreamSynchronize(s), "fill");
  }
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
Stats StatsOf(std::vector<double> us) {
  Stats st;
  if (us.empty()) return st;
  std::sort(us.begin(), us.end());
  const int reps = static_cast<int>(us.size());
  st.reps = reps;
  st.min_us = us.front();
  st.median_us = reps % 2 ? us[reps / 2] : 0.5 * (us[reps / 2 - 1] + us[reps / 2]);
  st.p90_us = us[std::min<int>(reps - 1, static_cast<int>(std::ceil(0.9 * reps)) - 1)];
  return st;
}

// n runs of `run(set)`, each behind a spin and between two events, then one synchronize and
// `after`; each run's time in microseconds, or nothing if a run failed (already reported).
std::vector<double> Batch(cudaStream_t s, Sets& sets, int n, const std::function<bool(int)>& run,
                          const std::function<void()>& after) {
  std::vector<cudaEvent_t> ev(2 * n);
  for (cudaEvent_t& e : ev) Check(cudaEventCreate(&e), "cudaEventCreate");
  bool ok = true;
  for (int i = 0; i < n && ok; ++i) {
    Check(Spin(kSpinNs, s), "spin");
    Check(cudaEventRecord(ev[2 * i], s), "event");
    ok = run(sets.Next());
    Check(cudaEventRecord(ev[2 * i + 1], s), "event");
  }
  Check(cudaStreamSynchronize(s), "timed runs");
  if (after) after();
  std::vector<double> us;
  for (int i = 0; i < n && ok; ++i) {
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    us.push_back(ms * 1e3);
  }
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  return us;
}

// The warm-up: module loading, handle creation, the pool's first allocations. One run, and
// kWarmups - 1 more unless it was slower than kSlowRunMs. Returns the last warm-up's time in
// milliseconds (it decides how many timed runs fit), or -1 on failure.
double WarmUp(cudaStream_t s, Sets& sets, const std::function<bool(int)>& run,
              const std::function<void()>& after) {
  std::vector<double> w = Batch(s, sets, 1, run, after);
  if (!w.empty() && w[0] < kSlowRunMs * 1e3) w = Batch(s, sets, kWarmups - 1, run, after);
  return w.empty() ? -1.0 : w.back() * 1e-3;
}

// Times `run(set)` per the method above: the warm-up, then max_reps timed runs, or kMinReps
// when a run takes kSlowRunMs or more.
Stats TimeRuns(cudaStream_t s, Sets& sets, int max_reps, const std::function<bool(int)>& run,
               const std::function<void()>& after_batch) {
  const double ms = WarmUp(s, sets, run, after_batch);
  if (ms < 0) return {};
  const int reps = ms < kSlowRunMs ? max_reps : kMinReps;
  std::vector<double> us = Batch(s, sets, reps, run, after_batch);
  if (static_cast<int>(us.size()) != reps) return {};
  return StatsOf(std::move(us));
}

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
void TimeGroup(cudaStream_t s, Sets& sets, int max_reps, std::vector<Timed>& entries) {
  std::vector<size_t> fast;
  for (size_t i = 0; i < entries.size(); ++i) {
    Timed& e = entries[i];
    const double ms = WarmUp(s, sets, e.run, e.after);
    if (ms < 0) continue;  // failed: reported by run, left at reps 0
    if (ms >= kSlowRunMs) {
      std::vector<double> us = Batch(s, sets, kMinReps, e.run, e.after);
      if (static_cast<int>(us.size()) == kMinReps) e.st = StatsOf(std::move(us));
    } else {
      fast.push_back(i);
    }
  }
  if (fast.empty()) return;
  const size_t n = fast.size();
  std::vector<std::vector<double>> us(n);
  std::vector<bool> failed(n, false);
  std::vector<cudaEvent_t> ev(2 * n);
  for (cudaEvent_t& e : ev) Check(cudaEventCreate(&e), "cudaEventCreate");
  for (int r = 0; r < max_reps; ++r) {
    std::vector<bool> ran(n, false);
    for (size_t k = 0; k < n; ++k) {
      const size_t j = (k + static_cast<size_t>(r)) % n;
      if (failed[j]) continue;
      Check(Spin(kSpinNs, s), "spin");
      Check(cudaEventRecord(ev[2 * j], s), "event");
      ran[j] = entries[fast[j]].run(sets.Next());
      Check(cudaEventRecord(ev[2 * j + 1], s), "event");
      if (!ran[j]) {
        failed[j] = true;
        if (entries[fast[j]].after) entries[fast[j]].after();  // its own leftovers, not another's
      }
    }
    Check(cudaStreamSynchronize(s), "timed round");
    for (size_t j = 0; j < n; ++j) {
      if (!ran[j]) continue;
      if (entries[fast[j]].after) entries[fast[j]].after();
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, ev[2 * j], ev[2 * j + 1]), "cudaEventElapsedTime");
      us[j].push_back(ms * 1e3);
    }
  }
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  for (size_t j = 0; j < n; ++j) {
    if (!failed[j]) entries[fast[j]].st = StatsOf(std::move(us[j]));
  }
}

std::string Dims(const std::vector<int64_t>& d) { return absl::StrJoin(d, "x"); }

// One benchmark case: an op on given input metas.
struct Case {
  const OpSpec* op;
  std::vector<TensorMeta> inputs;
  TensorMeta output;
  std::string shape;
  std::string dtype;
  Cost cost;
};

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

class Bench {
 public:
  Bench(Options opt, Backend* backend, ExecEnv* env)
      : opt_(std::move(opt)), backend_(backend), env_(env),
        stream_(static_cast<cudaStream_t>(env->stream())) {
    Check(blas_.Init(stream_), "cuBLAS init");
  }

  Report& report() { return report_; }

  void Ceilings() {
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

  void Sum() {
    struct S {
      int64_t n;
      std::string label;
      DType dtype;
    };
    std::vector<S> cases;
    const std::vector<std::pair<int64_t, std::string>> sizes =
        opt_.quick ? std::vector<std::pair<int64_t, std::string>>{{int64_t{1} << 30, "2^30"}}
                   : std::vector<std::pair<int64_t, std::string>>{{int64_t{1} << 30, "2^30"},
                                                                  {int64_t{1} << 24, "2^24"},
                                                                  {int64_t{1} << 20, "2^20"}};
    for (const auto& [n, label] : sizes) {
      for (DType d : {DType::kInt32, DType::kFloat32}) cases.push_back({n, label, d});
    }
    // INT64 and BFLOAT16, informational (no target): 2 GiB / 512 MiB inputs, each far past L2.
    if (!opt_.quick) {
      for (DType d : {DType::kInt64, DType::kBFloat16}) cases.push_back({int64_t{1} << 28, "2^28", d});
    }
    for (const S& sc : cases) {
      const int64_t n = sc.n;
      const DType d = sc.dtype;
      if (!WantShape(sc.label)) continue;
      std::optional<Case> served = d == DType::kInt32 || d == DType::kFloat32
                                       ? MakeCase("sum", {TensorMeta{d, {n}}}, sc.label)
                                       : CaseIfServed("sum", {TensorMeta{d, {n}}}, sc.label);
      if (!served) continue;
      const Case& c = *served;
      Sets sets(c.inputs, c.output, stream_);
      // The anchor: cub::DeviceReduce::Sum in the op's accumulator (int32 widened to int64,
      // bf16 to float, as the op does).
      size_t temp_bytes = 0;
      Check(RunCubSum(c, nullptr, &temp_bytes, sets.in(0, 0), sets.out(0)), "cub size");
      DeviceMem temp(temp_bytes);
      DeviceMem ref(8);
      auto anchor = [&](int set, void* out) {
        size_t tb = temp_bytes;
        return RunCubSum(c, temp.get(), &tb, sets.in(0, set), out) == cudaSuccess;
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
      RunTableAlgorithms(c, sets, anchors, nullptr, check, {});
    }
  }

  void RowMean() {
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
      if (!WantShape(label)) continue;
      const std::vector<TensorMeta> in = {TensorMeta{s.dtype, {s.rows, s.cols}}};
      std::optional<Case> served = s.dtype == DType::kFloat32
                                       ? MakeCase("row_mean", in, label)
                                       : CaseIfServed("row_mean", in, label);
      if (!served) continue;
      const Case& c = *served;
      Sets sets(c.inputs, c.output, stream_);
      // CUB's segmented sum over the same rows; BFLOAT16 in a float32 accumulator, as the op's.
      auto segmented = [&](void* temp, size_t* tb, const void* rows_in, void* out) {
        if (s.dtype == DType::kBFloat16) {
          return CubSegmentedSum(temp, tb, static_cast<const uint16_t*>(rows_in),
                                 static_cast<float*>(out), s.rows, s.cols, stream_);
        }
        return CubSegmentedSum(temp, tb, static_cast<const float*>(rows_in),
                               static_cast<float*>(out), s.rows, s.cols, stream_);
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
          ReadStreamAnchor(c, sets)};
      anchor(0, ref.get());
      Check(ScaleInPlace(reinterpret_cast<float*>(ref.get()), s.rows, 1.0f / s.cols, stream_), "scale");
      auto check = [&](Row& r) {
        Check(RelativeError(static_cast<const float*>(sets.out(0)),
                            reinterpret_cast<const float*>(ref.get()), s.rows, &r.error, stream_),
              "error");
        r.error_ok = r.error < 1e-4;
      };
      RunTableAlgorithms(c, sets, anchors, nullptr, check, [&](Row& r) {
        r.anchor2 = "read_stream";
        r.ratio2 = report_.stream_gbps > 0 ? r.gbps / report_.stream_gbps : 0;
      });
    }
  }

  // row_sum INT32 -> INT64 (exact), informational (no target): the table against CUB's segmented
  // reduce with an int64 accumulator and the read stream over the same bytes.
  void RowSum() {
    struct S {
      int64_t rows, cols;
    };
    const std::vector<S> shapes = {{8192, 8192}};
    for (const S& s : shapes) {
      const std::string label = absl::StrCat(s.rows, "x", s.cols);
      if (!WantShape(label)) continue;
      std::optional<Case> served =
          CaseIfServed("row_sum", {TensorMeta{DType::kInt32, {s.rows, s.cols}}}, label);
      if (!served) continue;
      const Case& c = *served;
      Sets sets(c.inputs, c.output, stream_);
      size_t temp_bytes = 0;
      Check(CubSegmentedSum(nullptr, &temp_bytes, static_cast<const int32_t*>(nullptr),
                            static_cast<int64_t*>(nullptr), s.rows, s.cols, stream_),
            "cub segmented size");
      DeviceMem temp(temp_bytes);
      DeviceMem ref(s.rows * sizeof(int64_t));
      auto anchor = [&](int set, void* out) {
        size_t tb = temp_bytes;
        return CubSegmentedSum(temp.get(), &tb, static_cast<const int32_t*>(sets.in(0, set)),
                               static_cast<int64_t*>(out), s.rows, s.cols, stream_) == cudaSuccess;
      };
      const std::vector<AnchorSpec> anchors = {
          {"cub_segmented_sum", [&](int set) { return anchor(set, sets.out(set)); }},
          ReadStreamAnchor(c, sets)};
      anchor(0, ref.get());
      auto check = [&](Row& r) {
        uint64_t bad = 0;
        Check(Mismatches64(static_cast<const uint64_t*>(sets.out(0)),
                           reinterpret_cast<const uint64_t*>(ref.get()), s.rows, &bad, stream_),
              "row_sum check");
        r.error = static_cast<double>(bad);
        r.error_ok = bad == 0;
      };
      RunTableAlgorithms(c, sets, anchors, nullptr, check, [&](Row& r) {
        r.anchor2 = "read_stream";
        r.ratio2 = report_.stream_gbps > 0 ? r.gbps / report_.stream_gbps : 0;
      });
    }
  }

  void Transpose() {
    struct S {
      int64_t rows, cols;
    };
    std::vector<S> shapes = {{4096, 4096}, {16384, 16384}, {32768, 32768}, {8192, 32768}};
    if (opt_.quick) shapes = {{16384, 16384}, {32768, 32768}};
    for (const S& s : shapes) {
      const std::string label = absl::StrCat(s.rows, "x", s.cols);
      if (!WantShape(label)) continue;
      Case c = MakeCase("transpose", {TensorMeta{DType::kFloat32, {s.rows, s.cols}}}, label);
      Sets sets(c.inputs, c.output, stream_);
      Row a = CeilingAnchor("d2d_copy", report_.copy_gbps);
      auto check = [&](Row& r) {
        uint64_t bad = 0;
        Check(TransposeMismatches(static_cast<const uint32_t*>(sets.in(0, 0)),
                                  static_cast<const uint32_t*>(sets.out(0)), s.rows, s.cols, &bad,
                                  stream_),
              "transpose check");
        r.error = static_cast<double>(bad);
        r.error_ok = bad == 0;
      };
      RunTableAlgorithms(c, sets, {}, &a, check, {});
    }
  }

  void Matmul() {
    struct S {
      int64_t m, n, k;
    };
    std::vector<S> shapes = {{1024, 1024, 1024}, {4096, 4096, 4096}, {8192, 8192, 8192},
                             {4095, 4097, 1023}};
    if (opt_.quick) shapes = {{4096, 4096, 4096}};
    for (const S& s : shapes) {
      const std::string label = absl::StrCat(s.m, "x", s.n, "x", s.k);
      if (!WantShape(label)) continue;
      for (DType d : {DType::kFloat32, DType::kBFloat16}) {
        Case c = MakeCase("matmul", {TensorMeta{d, {s.m, s.k}}, TensorMeta{d, {s.k, s.n}}}, label);
        Sets sets(c.inputs, c.output, stream_);
        DeviceMem ref(s.m * s.n * sizeof(float));
        auto gemm = [&](Blas::Precision p, int set, void* out) {
          return blas_.Gemm(p, sets.in(0, set), sets.in(1, set), static_cast<float*>(out), s.m, s.n,
                            s.k) == cudaSuccess;
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
                              reinterpret_cast<const float*>(ref.get()), s.m * s.n, &r.error, stream_),
                "error");
          r.error_ok = r.error < (r.dtype == "TF32" ? 5e-3 : 1e-3);
        };
        RunTableAlgorithms(c, sets, anchors, nullptr, check, {}, d == DType::kFloat32 ? 1 : -1);
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
  void CublasHandles() {
    struct S {
      int64_t m, n, k;
    };
    const S shapes[] = {{8192, 8192, 8192}, {4096, 4096, 4096}};
    const AlgoSpec* table_cublas = nullptr;
    const AlgoSpec* table_tc = nullptr;
    for (const AlgoSpec* a : AlgorithmsFor("matmul", *backend_)) {
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
    void* fresh = CreateBlasHandle(stream_, 0, &ws_none);
    void* fresh_ws = CreateBlasHandle(stream_, kWorkspace, &ws_32);
    if (fresh == nullptr || fresh_ws == nullptr) Die("cuBLAS: fresh handles");
    for (const S& s : shapes) {
      const std::string label = absl::StrCat(s.m, "x", s.n, "x", s.k);
      if (!WantShape(label)) continue;
      Case c = MakeCase("matmul", {TensorMeta{DType::kBFloat16, {s.m, s.k}},
                                   TensorMeta{DType::kBFloat16, {s.k, s.n}}},
                        label);
      Sets sets(c.inputs, c.output, stream_);
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
             return blas_.Gemm(Blas::Precision::kBf16, sets.in(0, set), sets.in(1, set),
                               static_cast<float*>(sets.out(set)), s.m, s.n, s.k) == cudaSuccess;
           }},
          {"table_row_server_handle", [&](int set) { return RunTable(*table_cublas, c, sets, set); }},
          {"server_handle_linked", direct(env_->blas_handle())},
          {"fresh_handle", direct(fresh)},
          {"fresh_handle_ws32MiB", direct(fresh_ws)},
          {"table_tensor_core_sm90a", [&](int set) { return RunTable(*table_tc, c, sets, set); }},
      };
      const int nv = static_cast<int>(variants.size());
      if (nv != 6) Die("cublas_handles: the blocked order below lists 6 variants");
      const int rounds = opt_.reps;
      DeviceMem mhz(sizeof(float) * nv * rounds * 2);
      float* d_mhz = reinterpret_cast<float*>(mhz.get());
      constexpr int64_t kProbeNs = 50 * 1000;
      // One timed run of variant v into slot `slot`; returns false on failure.
      std::vector<cudaEvent_t> ev(2 * nv * rounds * 2);
      for (cudaEvent_t& e : ev) Check(cudaEventCreate(&e), "cudaEventCreate");
      auto timed = [&](int v, int slot) {
        Check(Spin(kSpinNs, stream_), "spin");
        Check(cudaEventRecord(ev[2 * slot], stream_), "event");
        const bool ok = variants[v].run(sets.Next());
        Check(cudaEventRecord(ev[2 * slot + 1], stream_), "event");
        Check(ClockProbe(d_mhz + slot, kProbeNs, stream_), "clock probe");
        return ok;
      };
      // Warm-up: every variant twice (handles' first-call setup, heuristics caches).
      for (int w = 0; w < 2; ++w) {
        for (int v = 0; v < nv; ++v) {
          if (!variants[v].run(sets.Next())) Die(absl::StrCat("cublas_handles: ", variants[v].name));
        }
      }
      FinishEnv();
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
      FinishEnv();
      if (!ok) Die("cublas_handles: a run failed");
      std::vector<float> h_mhz(nv * rounds * 2);
      Check(cudaMemcpy(h_mhz.data(), d_mhz, h_mhz.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "read clocks");
      auto median = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        const size_t n = x.size();
        return n == 0 ? 0.0 : (n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]));
      };
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
          Row row;
          row.op = "cublas_handles";
          row.shape = label;
          row.dtype = "BFLOAT16";
          row.algorithm = absl::StrCat(phase == 0 ? "interleaved:" : "blocked:", variants[v].name);
          row.reps = rounds;
          row.median_us = median(us);
          row.min_us = *std::min_element(us.begin(), us.end());
          row.flops = c.cost.flops;
          row.bytes = c.cost.bytes;
          row.tflops = row.flops / (row.median_us * 1e-6) / 1e12;
          row.gbps = row.bytes / (row.median_us * 1e-6) / 1e9;
          row.anchor = "-";
          row.anchor2 = "sm_mhz";  // the "vs stream" column of these rows: the SM clock, MHz
          row.ratio2 = median(clk);
          report_.rows.push_back(row);
          std::printf("  %-36s %9.1f / %9.1f us %7.1f TFLOP/s  %6.0f MHz\n", row.algorithm.c_str(),
                      row.median_us, row.min_us, row.tflops, median(clk));
        }
      }
      std::fflush(stdout);
      for (cudaEvent_t& e : ev) cudaEventDestroy(e);
    }
    DestroyBlasHandle(fresh, ws_none);
    DestroyBlasHandle(fresh_ws, ws_32);
  }

  // TransposeTma's knobs (kernels/transpose_tma_tuning.h) over the transpose shapes: first every
  // tile shape on ragged shapes against the element-wise check, then the timings. Writes
  // DIR/transpose_sweep.csv and prints each shape's fastest settings.
  void TransposeSweep(const std::string& dir) {
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
    if (!opt_.sweep_one_tile) {  // the persistent settings
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
        Sets sets({m}, TensorMeta{DType::kFloat32, {c, r}}, stream_);
        Check(kernels::TransposeTmaTuned(tu, sets.in(0, 0), sets.out(0), r, c, 4, stream_),
              "TransposeTmaTuned");
        uint64_t mismatches = 0;
        Check(TransposeMismatches(static_cast<const uint32_t*>(sets.in(0, 0)),
                                  static_cast<const uint32_t*>(sets.out(0)), r, c, &mismatches,
                                  stream_),
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
      Sets sets({m}, TensorMeta{DType::kFloat32, {c, r}}, stream_);
      const uint64_t bytes = 2 * m.Bytes();
      std::vector<std::pair<double, std::string>> results;
      for (const auto& tu : tunings) {
        Stats st = TimeRuns(
            stream_, sets, opt_.reps,
            [&](int set) {
              return kernels::TransposeTmaTuned(tu, sets.in(0, set), sets.out(set), r, c, 4,
                                                stream_) == cudaSuccess;
            },
            [] {});
        const int checks = 1 + (tu.max_ctas_per_sm >= 3 ? kRechecks : 0);
        int failed_checks = 0;
        uint64_t worst = 0;
        int64_t first_bad = -1;
        for (int k = 0; k < checks; ++k) {
          // A fresh poison each time, so a check cannot pass on an earlier run's output.
          Check(cudaMemsetAsync(sets.out(0), 0xFF, m.Bytes(), stream_), "poison");
          Check(kernels::TransposeTmaTuned(tu, sets.in(0, 0), sets.out(0), r, c, 4, stream_), "run");
          uint64_t mismatches = 0;
          int64_t bad = -1;
          Check(TransposeMismatches(static_cast<const uint32_t*>(sets.in(0, 0)),
                                    static_cast<const uint32_t*>(sets.out(0)), r, c, &mismatches,
                                    stream_, &bad),
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
                               name(tu), st.median_us, gbps, gbps / report_.copy_gbps, ok ? 1 : 0,
                               checks, failed_checks, static_cast<unsigned long>(worst),
                               long(first_bad < 0 ? -1 : first_bad / c),
                               long(first_bad < 0 ? -1 : first_bad % c));
        results.push_back({st.median_us, name(tu) + (ok ? "" : " CHECK FAILED")});
      }
      std::sort(results.begin(), results.end());
      std::printf("transpose sweep %ldx%ld (copy %.0f GB/s):\n", long(r), long(c), report_.copy_gbps);
      for (size_t i = 0; i < results.size(); ++i) {
        const bool is_default = results[i].second == default_name ||
                                results[i].second.rfind(default_name + " ", 0) == 0;
        if (i < 8 || is_default) {
          const double gbps = bytes / (results[i].first * 1e-6) / 1e9;
          std::printf("  %2zu %-32s %9.1f us %7.0f GB/s %.3fx%s\n", i + 1, results[i].second.c_str(),
                      results[i].first, gbps, gbps / report_.copy_gbps,
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

 private:
  bool WantShape(const std::string& label) const {
    return opt_.shapes.empty() || opt_.shapes.count(label) > 0;
  }
  bool WantAlgo(const std::string& name) const {
    return opt_.algos.empty() || opt_.algos.count(name) > 0;
  }

  cudaError_t RunCubSum(const Case& c, void* temp, size_t* temp_bytes, void* in, void* out) {
    const int64_t n = c.inputs[0].NumElements();
    switch (c.inputs[0].dtype) {
      case DType::kInt32:
        return CubReduceSum(temp, temp_bytes, static_cast<const int32_t*>(in),
                            static_cast<int64_t*>(out), n, stream_);
      case DType::kInt64:
        return CubReduceSum(temp, temp_bytes, static_cast<const int64_t*>(in),
                            static_cast<int64_t*>(out), n, stream_);
      case DType::kBFloat16:
        return CubReduceSum(temp, temp_bytes, static_cast<const uint16_t*>(in),
                            static_cast<float*>(out), n, stream_);
      default:
        return CubReduceSum(temp, temp_bytes, static_cast<const float*>(in),
                            static_cast<float*>(out), n, stream_);
    }
  }

  // A case whose dtype the op table may not serve yet: the case, or nothing (with a line saying
  // why) when the op rejects the dtype or no "cuda" row of the table takes it.
  std::optional<Case> CaseIfServed(absl::string_view op_name, std::vector<TensorMeta> inputs,
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

  static void SetStats(Row& r, const Stats& st) {
    r.reps = st.reps;
    r.median_us = st.median_us;
    r.min_us = st.min_us;
    r.p90_us = st.p90_us;
    if (st.median_us > 0) {
      r.gbps = r.bytes / (st.median_us * 1e-6) / 1e9;
      r.tflops = r.flops / (st.median_us * 1e-6) / 1e12;
    }
  }

  Row CeilingRow(std::string name, std::string shape, std::string dtype, const Stats& st,
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

  // A ceiling used as a bandwidth anchor (no timing of its own in this case).
  Row CeilingAnchor(std::string name, double gbps) {
    Row r;
    r.algorithm = std::move(name);
    r.gbps = gbps;
    r.is_anchor = true;
    return r;
  }

  // A timed anchor of a case: CUB, cuBLAS or a read stream on the case's own inputs.
  struct AnchorSpec {
    std::string name;
    std::function<bool(int)> run;
    uint64_t bytes = 0;  // 0: the op's Cost
    std::string dtype;   // empty: the case's
  };

  // The read stream over exactly the case's input bytes (a whole number of float4s here).
  AnchorSpec ReadStreamAnchor(const Case& c, Sets& sets) {
    const uint64_t bytes = c.inputs[0].Bytes();
    return {"read_stream_same_bytes",
            [this, &sets, bytes](int set) {
              return ReadStream(static_cast<const float*>(sets.in(0, set)),
                                static_cast<int64_t>(bytes / 4), static_cast<float*>(sets.out(set)),
                                stream_) == cudaSuccess;
            },
            bytes};
  }

  Row AnchorRowFrom(const Case& c, const AnchorSpec& spec, const Stats& st) {
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

  bool RunTable(const AlgoSpec& a, const Case& c, Sets& sets, int set) {
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

  void FinishEnv() {
    auto done = env_->Finish(0);
    if (!done.ok()) Die(std::string(done.status().message()));
  }

  // Every "cuda" row of the table for this op and dtype, then `auto`, timed in one interleaved
  // group with the case's anchors (TimeGroup). The ratio's reference is anchors[0], or `fixed`
  // (by GB/s: transpose's copy ceiling) when there are no timed anchors; anchors[tf32] (when >= 0)
  // is the reference of the tensor-core rows on FLOAT32, which compute in TF32.
  void RunTableAlgorithms(const Case& c, Sets& sets, const std::vector<AnchorSpec>& anchors,
                          const Row* fixed, const std::function<void(Row&)>& check,
                          const std::function<void(Row&)>& extra, int tf32 = -1) {
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

  static void Print(const Row& r) {
    std::printf("  %-9s %-15s %-8s %-26s %10.1f us %8.1f GB/s %7.2f TF/s  ratio %.3f %s\n",
                r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.algorithm.c_str(), r.median_us,
                r.gbps, r.tflops, r.ratio, r.error_ok ? "" : "  OUTPUT CHECK FAILED");
    std::fflush(stdout);
  }

  Options opt_;
  Backend* backend_;
  ExecEnv* env_;
  cudaStream_t stream_;
  Blas blas_;
  Report report_;
};

// ---- Targets (issue 4), read off the rows. ----

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

void AddTargets(Report& rep) {
  auto add = [&](std::string what, std::string measured, bool holds) {
    rep.targets.push_back({std::move(what), std::move(measured), holds});
  };
  for (const char* d : {"INT32", "FLOAT32"}) {
    const Row* best = nullptr;
    for (const Row& r : rep.rows) {
      if (r.op == "sum" && r.shape == "2^30" && r.dtype == d && !r.is_anchor &&
          r.algorithm.rfind("auto->", 0) != 0 && (best == nullptr || r.ratio > best->ratio)) {
        best = &r;
      }
    }
    if (best) {
      add(absl::StrCat("sum 2^30 ", d, ": best >= 1.00x CUB"),
          absl::StrFormat("%s %.3fx (%.0f GB/s)", best->algorithm, best->ratio, best->gbps),
          best->ratio >= 1.0);
    }
  }
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
      add(absl::StrCat("row_mean ", r.shape, ": auto >= 1.00x CUB segmented"),
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
      add(absl::StrCat("row_mean ", r.shape, ": auto >= 0.90x read stream"),
          absl::StrFormat("%.3fx (%.0f GB/s)%s", r.ratio2, r.gbps, bound), r.ratio2 >= 0.90);
    }
    if (r.shape == "10x2048") {
      add("row_mean 10x2048: auto <= 6 us", absl::StrFormat("%.2f us", r.median_us),
          r.median_us <= 6.0);
    }
  }
  // BFLOAT16 row_mean: auto, and block_per_row when auto chose another kernel, against CUB's
  // segmented reduce over the same bf16 rows with a float32 accumulator and against the read
  // stream over the same bytes, both timed in the same group.
  {
    const std::string shape = "8192x8192";
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
          add(label, absl::StrFormat("%s %.3fx (%.1f vs %.1f us)", r->algorithm, ratio,
                                     r->median_us, cub->median_us),
              ratio >= 1.0);
        }
      }
      if (stream != nullptr && stream->median_us > 0 && r->median_us > 0) {
        const double ratio = stream->median_us / r->median_us;
        add(absl::StrCat(what, name, " >= 0.90x read stream (same bytes)"),
            absl::StrFormat("%s %.3fx (%.0f GB/s)", r->algorithm, ratio, r->gbps), ratio >= 0.90);
      }
    }
    // FLOAT32 ran at this shape but BFLOAT16 did not: the table does not serve it (yet).
    if (rows.empty() && FindAuto(rep, "row_mean", shape, "FLOAT32") != nullptr) {
      add(absl::StrCat(what, "auto >= 1.00x CUB segmented (f32 acc)"),
          "not measured: no cuda row_mean of the op table takes BFLOAT16", false);
    }
  }
  for (const char* s : {"16384x16384", "32768x32768"}) {
    const Row* best = nullptr;
    for (const Row& r : rep.rows) {
      if (r.op == "transpose" && r.shape == s && r.algorithm.rfind("auto->", 0) != 0 &&
          (best == nullptr || r.ratio > best->ratio)) {
        best = &r;
      }
    }
    if (best) {
      add(absl::StrCat("transpose ", s, ": best >= 0.95x D2D copy"),
          absl::StrFormat("%s %.3fx (%.0f GB/s)", best->algorithm, best->ratio, best->gbps),
          best->ratio >= 0.95);
    }
  }
  if (const Row* r = Find(rep, "matmul", "4096x4096x4096", "FLOAT32", "block_tiled_vectorized")) {
    add("matmul 4096^3: block_tiled_vectorized >= 0.60x cuBLAS SGEMM",
        absl::StrFormat("%.3fx (%.1f TFLOP/s)", r->ratio, r->tflops), r->ratio >= 0.60);
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
      add(what, absl::StrFormat("%.3fx (%.1f TFLOP/s)", r->ratio, r->tflops), r->ratio >= 0.50);
    } else if (case_ran) {
      add(what, "not measured: no tensor_core_sm90a row in the op table", false);
    }
  }
  for (const Row& r : rep.rows) {
    if (r.algorithm.rfind("auto->", 0) != 0 || r.best.empty()) continue;
    add(absl::StrCat(r.op, " ", r.shape, " ", r.dtype, ": auto within 5% of the fastest"),
        absl::StrFormat("%s %.3f of %s", r.algorithm, r.vs_best, r.best), r.vs_best >= 0.95);
  }
  const ServiceFigures& s = rep.service;
  if (s.ran) {
    add("service: Execute p50 - kernel <= 1.5x health p50",
        absl::StrFormat("%.1f us vs 1.5 x %.1f = %.1f us", s.overhead_p50_us, s.health_p50_us,
                        1.5 * s.health_p50_us),
        s.overhead_p50_us <= 1.5 * s.health_p50_us);
    add("service: PutTensor 1 GiB >= 1.5 GB/s", absl::StrFormat("%.2f GB/s", s.put_gbps),
        s.put_gbps >= 1.5);
    add("service: GetTensor 1 GiB >= 1.5 GB/s", absl::StrFormat("%.2f GB/s", s.get_gbps),
        s.get_gbps >= 1.5);
  }
}

std::set<std::string> SplitSet(const std::string& s) {
  std::set<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) out.emplace(p);
  return out;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--ops=")) {
      o.ops = SplitSet(v);
    } else if (a == "--service") {
      o.ops = {"service"};
    } else if (a == "--quick") {
      o.quick = true;
    } else if (const char* v = val("--out=")) {
      o.out_dir = v;
    } else if (const char* v = val("--reps=")) {
      o.reps = std::max(kMinReps, std::atoi(v));
    } else if (const char* v = val("--algos=")) {
      o.algos = SplitSet(v);
    } else if (const char* v = val("--shapes=")) {
      o.shapes = SplitSet(v);
    } else if (a == "--transpose-sweep") {
      o.transpose_sweep = true;
    } else if (a == "--sweep_one_tile") {
      o.sweep_one_tile = true;
      o.transpose_sweep = true;
    } else if (const char* v = val("--server_arg=")) {
      o.server_args.emplace_back(v);
    } else if (const char* v = val("--chunk_bytes=")) {
      o.chunk_bytes = std::atoll(v);
    } else if (const char* v = val("--opserve=")) {
      o.opserve_bin = v;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "opserve-bench [--ops=sum,row_mean,row_sum,transpose,matmul,service,cublas_handles]\n"
          "              [--service]\n"
          "              [--quick]\n"
          "              [--out=DIR] [--reps=N>=20] [--algos=a,b,auto] [--shapes=LABEL,...]\n"
          "              [--opserve=PATH] [--transpose-sweep] [--chunk_bytes=N]\n"
          "              [--server_arg=ARG ...]\n");
      std::exit(0);
    } else {
      Die(absl::StrCat("unknown argument ", a, " (--help lists them)"));
    }
  }
  return o;
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  return p.substr(0, p.rfind('/'));
}

}  // namespace
}  // namespace opserve::bench

int main(int argc, char** argv) {
  using namespace opserve;
  using namespace opserve::bench;
  Options opt = ParseArgs(argc, argv);
  Report rep;
  {
    std::vector<std::string> args(argv, argv + argc);
    rep.command = absl::StrJoin(args, " ");
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
    rep.date = date;
  }
  // `--ops=service --server_arg=--device=cpu` runs without a GPU: the service path of the CPU
  // backend, for looking at the gRPC side of the overhead on any machine.
  const bool service_only = opt.ops.size() == 1 && opt.ops.count("service") && !opt.transpose_sweep;
  bool have_gpu = true;
  if (absl::Status s = ProbeCuda(0); !s.ok()) {
    if (!service_only) Die(absl::StrCat("no usable GPU: ", s.message()));
    rep.device = absl::StrCat("no usable GPU (", s.message(), "), service path only");
    have_gpu = false;
  } else {
    cudaDeviceProp prop{};
    Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    rep.device = absl::StrFormat("%s (sm_%d%d, %d SMs, %d MB L2, %zu MiB)", prop.name, prop.major,
                                 prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
                                 prop.totalGlobalMem >> 20);
  }
  std::printf("opserve-bench on %s, %s\n  %s\n", rep.device.c_str(), rep.date.c_str(),
              rep.command.c_str());

  const bool kernels = opt.ops.count("sum") || opt.ops.count("row_mean") || opt.ops.count("row_sum") ||
                       opt.ops.count("transpose") || opt.ops.count("matmul") ||
                       opt.ops.count("cublas_handles") ||
                       opt.transpose_sweep;
  if (kernels) {
    // The server's own backend and execution context: the table rows run exactly as they do
    // inside opserve (scratch from the stream-ordered pool, the worker's stream and cuBLAS handle).
    auto backend = MakeCudaBackend(0, 0);
    if (!backend.ok()) Die(std::string(backend.status().message()));
    auto env = (*backend)->NewExecEnv();
    if (!env.ok()) Die(std::string(env.status().message()));
    Bench bench(opt, backend->get(), env->get());
    std::printf("ceilings\n");
    bench.Ceilings();
    if (opt.transpose_sweep) bench.TransposeSweep(opt.out_dir);
    if (opt.ops.count("sum")) bench.Sum();
    if (opt.ops.count("row_mean")) bench.RowMean();
    if (opt.ops.count("row_sum")) bench.RowSum();
    if (opt.ops.count("transpose")) bench.Transpose();
    if (opt.ops.count("matmul")) bench.Matmul();
    if (opt.ops.count("cublas_handles")) bench.CublasHandles();
    Report& r = bench.report();
    rep.rows = std::move(r.rows);
    rep.copy_gbps = r.copy_gbps;
    rep.stream_gbps = r.stream_gbps;
    rep.floor_us = r.floor_us;
  }
  if (opt.ops.count("service")) {
#if OPSERVE_BENCH_SERVICE
    ServiceOptions so;
    so.opserve_bin = opt.opserve_bin;
    so.chunk_bytes = opt.chunk_bytes;
    so.server_args = opt.server_args;
    // Without a GPU the server runs on the CPU backend; a --server_arg=--device=... still wins
    // (it comes later on the command line).
    if (!have_gpu) so.server_args.insert(so.server_args.begin(), "--device=cpu");
    if (so.opserve_bin.empty()) {
      const std::string beside = SelfDir() + "/opserve";
      so.opserve_bin = access(beside.c_str(), X_OK) == 0 ? beside : OPSERVE_BIN_DEFAULT;
    }
    std::printf("service path over loopback gRPC (%s, chunk %lld bytes; 0: the client default)\n", so.opserve_bin.c_str(), static_cast<long long>(so.chunk_bytes));
    std::fflush(stdout);
    rep.service = RunServiceBench(so);
#else
    rep.service.error = "built without the client library";
#endif
  }
  AddTargets(rep);
  PrintReport(rep);
  // A sweep run writes only its own transpose_sweep.csv.
  if (!opt.out_dir.empty() && !opt.transpose_sweep && !WriteReport(rep, opt.out_dir)) return 1;
  return 0;
}
