// The timing method of opserve-bench (harness.h has it in words): device memory outside the
// server's budget, input sets filled with fresh random values and rotated run by run, and the
// spin + events timing of one run, a batch of runs, or an interleaved group of them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_device.h"
#include "bench/harness.h"

namespace opserve::bench {
namespace {

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

uint64_t NextSeed() {
  static std::mt19937_64 rng(std::random_device{}() ^
                             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return rng();
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

}  // namespace

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "opserve-bench: %s\n", what.c_str());
  std::exit(2);
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    Die(absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
}

DeviceMem::DeviceMem(uint64_t bytes) : bytes_(bytes) {
  Check(cudaMalloc(&p_, std::max<uint64_t>(bytes, 1)), "cudaMalloc");
}

DeviceMem::~DeviceMem() { cudaFree(p_); }

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

Sets::Sets(const std::vector<TensorMeta>& inputs, const TensorMeta& output, cudaStream_t s) {
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

Stats TimeRuns(cudaStream_t s, Sets& sets, int max_reps, const std::function<bool(int)>& run,
               const std::function<void()>& after_batch) {
  const double ms = WarmUp(s, sets, run, after_batch);
  if (ms < 0) return {};
  const int reps = ms < kSlowRunMs ? max_reps : kMinReps;
  std::vector<double> us = Batch(s, sets, reps, run, after_batch);
  if (static_cast<int>(us.size()) != reps) return {};
  return StatsOf(std::move(us));
}

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

}  // namespace opserve::bench
