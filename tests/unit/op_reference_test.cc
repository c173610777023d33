// Every "cpu" row of the op table (Algorithms() in server/ops.h), run through KernelArgs with a
// CPU ExecEnv, against:
//  - hand-computed cases, and
//  - a float64 (or exact integer) reference computed here, on inputs drawn fresh each run, at edge
//    sizes (1, not a multiple of 32, large) and in every dtype the row accepts.
// The cases are generated from the table: a new cpu row is tested without editing this file, and
// a new op or dtype fails EveryCpuRowHasAModel / EveryCpuRowDtypeHasAHandCase until this file
// learns what it means. The reductions without an identity (max, min, row_max, row_min) are also
// run with NaNs placed at the first, a middle and the last element, and on empty inputs.
//
// Outputs are poisoned with 0xFF bytes (NaN for FLOAT32 and BFLOAT16, -1 for the integers) so
// an element the kernel never wrote fails, and fenced by guard bytes so a write past either end
// fails. NaN never passes a comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op_util.h"
#include "server/ops/op.h"

namespace opserve {
namespace {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

// Unit roundoff of float32: a correctly rounded float32 result is within kU * |x| of x.
constexpr double kU = 0x1p-24;
// Higham's gamma_n = n u / (1 - n u): the worst-case relative error of n float32 roundings.
double Gamma(int64_t n) { return n * kU / (1 - n * kU); }

constexpr uint8_t kPoison = 0xFF;   // output bytes before the kernel runs
constexpr uint8_t kGuard = 0xA5;    // bytes just outside the output
constexpr size_t kGuardBytes = 64;  // a cache line either side, keeping the output aligned

// ---------------------------------------------------------------------------------------------
// Host tensors and element access, written here rather than borrowed from the server so the
// reference shares no code with what it checks.

struct Tensor {
  TensorMeta meta;
  std::vector<uint8_t> bytes;
};

template <typename T>
T Load(const Tensor& t, int64_t i) {
  T v;
  std::memcpy(&v, t.bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Store(Tensor& t, int64_t i, T v) {
  std::memcpy(t.bytes.data() + i * sizeof(T), &v, sizeof(T));
}

// bfloat16 is the top half of a float32's bits.
float Bf16Value(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
// Only for values that bfloat16 holds exactly (the tests choose them so).
uint16_t Bf16Bits(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

bool IsInteger(DType d) { return d == DType::kInt32 || d == DType::kInt64; }

// An element as a double (exact for all but INT64 beyond 2^53; integers are compared exactly).
double At(const Tensor& t, int64_t i) {
  switch (t.meta.dtype) {
    case DType::kFloat32:
      return Load<float>(t, i);
    case DType::kInt32:
      return Load<int32_t>(t, i);
    case DType::kInt64:
      return static_cast<double>(Load<int64_t>(t, i));
    case DType::kBFloat16:
      return Bf16Value(Load<uint16_t>(t, i));
    case DType::kInvalid:
      break;
  }
  ADD_FAILURE() << "At: invalid dtype";
  return std::nan("");
}

int64_t IntAt(const Tensor& t, int64_t i) {
  return t.meta.dtype == DType::kInt32 ? Load<int32_t>(t, i) : Load<int64_t>(t, i);
}

Tensor Empty(DType dtype, std::vector<int64_t> shape) {
  Tensor t{{dtype, std::move(shape)}, {}};
  t.bytes.resize(t.meta.Bytes());
  return t;
}

Tensor F32(std::vector<int64_t> shape, std::vector<float> v) {
  Tensor t = Empty(DType::kFloat32, std::move(shape));
  EXPECT_EQ(v.size(), static_cast<size_t>(t.meta.NumElements()));
  for (size_t i = 0; i < v.size(); ++i) Store<float>(t, i, v[i]);
  return t;
}
Tensor Bf16(std::vector<int64_t> shape, std::vector<float> v) {
  Tensor t = Empty(DType::kBFloat16, std::move(shape));
  EXPECT_EQ(v.size(), static_cast<size_t>(t.meta.NumElements()));
  for (size_t i = 0; i < v.size(); ++i) Store<uint16_t>(t, i, Bf16Bits(v[i]));
  return t;
}
Tensor I32(std::vector<int64_t> shape, std::vector<int32_t> v) {
  Tensor t = Empty(DType::kInt32, std::move(shape));
  EXPECT_EQ(v.size(), static_cast<size_t>(t.meta.NumElements()));
  for (size_t i = 0; i < v.size(); ++i) Store<int32_t>(t, i, v[i]);
  return t;
}
Tensor I64(std::vector<int64_t> shape, std::vector<int64_t> v) {
  Tensor t = Empty(DType::kInt64, std::move(shape));
  EXPECT_EQ(v.size(), static_cast<size_t>(t.meta.NumElements()));
  for (size_t i = 0; i < v.size(); ++i) Store<int64_t>(t, i, v[i]);
  return t;
}

std::string ElementString(const Tensor& t, int64_t i) {
  std::ostringstream s;
  s.precision(9);
  if (IsInteger(t.meta.dtype)) {
    s << IntAt(t, i);
  } else {
    s << At(t, i);
  }
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// Running one table row.

Backend& Cpu() {
  static Backend* const backend = MakeCpuBackend(/*budget_bytes=*/0).release();
  return *backend;
}

// Runs `algo` as the executor does: output meta from the op's shape rule, KernelArgs, a CPU
// ExecEnv bracketing the node. The output lands in a poisoned, guarded buffer.
absl::StatusOr<Tensor> RunRow(const AlgoSpec& algo, const std::vector<Tensor>& inputs) {
  const OpSpec* op = FindOp(algo.op);
  if (op == nullptr) return absl::InternalError("the row's op is not in Ops()");
  if (static_cast<int>(inputs.size()) != op->arity) {
    return absl::InternalError("the test built the wrong number of inputs");
  }
  std::vector<TensorMeta> metas;
  std::vector<const void*> ptrs;
  for (const Tensor& t : inputs) {
    metas.push_back(t.meta);
    ptrs.push_back(t.bytes.data());
  }
  absl::StatusOr<TensorMeta> out_meta = op->infer(metas);
  if (!out_meta.ok()) return out_meta.status();

  const uint64_t out_bytes = out_meta->Bytes();
  std::vector<uint8_t> fenced(kGuardBytes + out_bytes + kGuardBytes, kGuard);
  std::memset(fenced.data() + kGuardBytes, kPoison, out_bytes);

  auto env = Cpu().NewExecEnv();
  if (!env.ok()) return env.status();
  AttrMap attrs;
  KernelArgs args{ptrs, metas, fenced.data() + kGuardBytes, *out_meta, attrs, **env};
  (*env)->MarkStart(0);
  absl::Status s = algo.run(args);
  (*env)->MarkEnd(0);
  absl::StatusOr<std::vector<double>> seconds = (*env)->Finish(1);
  if (!s.ok()) return s;
  if (!seconds.ok()) return seconds.status();

  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (fenced[i] != kGuard) {
      return absl::InternalError(
          absl::StrCat("wrote ", kGuardBytes - i, " byte(s) before the output"));
    }
    if (fenced[kGuardBytes + out_bytes + i] != kGuard) {
      return absl::InternalError(
          absl::StrCat("wrote past the end of the output, at byte ", out_bytes + i));
    }
  }
  Tensor out{*out_meta, {}};
  out.bytes.assign(fenced.begin() + kGuardBytes, fenced.begin() + kGuardBytes + out_bytes);
  return out;
}

std::vector<const AlgoSpec*> CpuRows() {
  std::vector<const AlgoSpec*> rows;
  for (const AlgoSpec& a : Algorithms()) {
    if (a.backend == "cpu") rows.push_back(&a);
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------
// The meaning of each op: the shapes to try, and a check against the reference.

// kRandom: values drawn over the dtype's ordinary range; floats are checked against a float64
//   reference within the worst-case float32 error bound.
// kExact: values whose every partial result is exact (small nonzero integers in floats: any
//   summation order gives the same bits, so a dropped or repeated term shows), and for the
//   integer dtypes values near the type's limits (an INT32 accumulator would overflow, a copy
//   through 32 bits would truncate INT64).
enum class Inputs { kRandom, kExact };

AssertionResult Near(const char* what, int64_t i, double got, double want, double tol) {
  if (std::isnan(got) || !(std::abs(got - want) <= tol)) {
    return AssertionFailure() << what << "[" << i << "] = " << got << ", expected " << want
                              << " within " << tol << " (off by " << std::abs(got - want) << ")";
  }
  return AssertionSuccess();
}

AssertionResult MetaIs(const Tensor& out, const TensorMeta& want) {
  if (out.meta == want) return AssertionSuccess();
  return AssertionFailure() << "output is " << out.meta.DebugString() << ", expected "
                            << want.DebugString();
}

// The exact sum of integer elements [begin, end), wrapped to int64 as numpy's int64 sum wraps.
int64_t WrappedSum(const Tensor& x, int64_t begin, int64_t end) {
  __int128 want = 0;
  for (int64_t i = begin; i < end; ++i) want += IntAt(x, i);
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<unsigned __int128>(want)));
}

// sum: any rank to a scalar; INT32 and INT64 exactly into INT64 (wrapping), FLOAT32 and BFLOAT16
// pairwise in FLOAT32.
AssertionResult CheckSum(const std::vector<Tensor>& in, const Tensor& out, Inputs kind) {
  const Tensor& x = in[0];
  const int64_t n = x.meta.NumElements();
  if (IsInteger(x.meta.dtype)) {
    if (auto r = MetaIs(out, {DType::kInt64, {}}); !r) return r;
    const int64_t want = WrappedSum(x, 0, n);
    const int64_t got = Load<int64_t>(out, 0);
    if (got != want) return AssertionFailure() << "sum = " << got << ", expected " << want;
    return AssertionSuccess();
  }
  if (auto r = MetaIs(out, {DType::kFloat32, {}}); !r) return r;
  double want = 0, magnitude = 0;
  for (int64_t i = 0; i < n; ++i) {
    want += At(x, i);
    magnitude += std::abs(At(x, i));
  }
  // Pairwise summation with leaves of up to 128 terms: at most 127 + log2(n) roundings deep.
  const int64_t depth = std::min<int64_t>(n, 128 + static_cast<int64_t>(std::ceil(std::log2(n))));
  const double tol = kind == Inputs::kExact ? 0.0 : Gamma(depth) * magnitude;
  return Near("sum", 0, At(out, 0), want, tol);
}

// Integer rows: row_sum exactly into INT64 (wrapping); row_mean that sum divided, in FLOAT32.
AssertionResult CheckIntegerRowReduce(const Tensor& x, const Tensor& out, bool mean) {
  const int64_t rows = x.meta.shape[0], cols = x.meta.shape[1];
  if (auto r = MetaIs(out, {mean ? DType::kFloat32 : DType::kInt64, {rows}}); !r) return r;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sum = WrappedSum(x, r * cols, (r + 1) * cols);
    if (!mean) {
      if (Load<int64_t>(out, r) != sum) {
        return AssertionFailure() << "row_sum[" << r << "] = " << Load<int64_t>(out, r)
                                  << ", expected " << sum;
      }
      continue;
    }
    const double want = static_cast<double>(sum) / static_cast<double>(cols);
    // One rounding to float32 after a float64 division of a float64-rounded sum.
    if (auto res = Near("row_mean", r, At(out, r), want, 2 * kU * std::abs(want)); !res) return res;
  }
  return AssertionSuccess();
}

AssertionResult CheckRowReduce(const std::vector<Tensor>& in, const Tensor& out, Inputs kind,
                               bool mean) {
  const Tensor& x = in[0];
  if (IsInteger(x.meta.dtype)) return CheckIntegerRowReduce(x, out, mean);
  const int64_t rows = x.meta.shape[0], cols = x.meta.shape[1];
  if (auto r = MetaIs(out, {DType::kFloat32, {rows}}); !r) return r;
  for (int64_t r = 0; r < rows; ++r) {
    double want = 0, magnitude = 0;
    for (int64_t c = 0; c < cols; ++c) {
      want += At(x, r * cols + c);
      magnitude += std::abs(At(x, r * cols + c));
    }
    double tol = kind == Inputs::kExact ? 0.0 : Gamma(cols) * magnitude;
    if (mean) {
      want /= static_cast<double>(cols);
      tol /= static_cast<double>(cols);
      // The division rounds once more (twice where 1/cols is formed first).
      tol += 2 * kU * std::abs(want);
    }
    if (auto res = Near(mean ? "row_mean" : "row_sum", r, At(out, r), want, tol); !res) return res;
  }
  return AssertionSuccess();
}

AssertionResult CheckRowSum(const std::vector<Tensor>& in, const Tensor& out, Inputs kind) {
  return CheckRowReduce(in, out, kind, /*mean=*/false);
}
AssertionResult CheckRowMean(const std::vector<Tensor>& in, const Tensor& out, Inputs kind) {
  return CheckRowReduce(in, out, kind, /*mean=*/true);
}

// transpose moves bits: every element must arrive exactly, whatever its dtype.
AssertionResult CheckTranspose(const std::vector<Tensor>& in, const Tensor& out, Inputs) {
  const Tensor& x = in[0];
  const int64_t rows = x.meta.shape[0], cols = x.meta.shape[1];
  if (auto r = MetaIs(out, {x.meta.dtype, {cols, rows}}); !r) return r;
  const size_t es = ElementSize(x.meta.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t src = r * cols + c, dst = c * rows + r;
      if (std::memcmp(x.bytes.data() + src * es, out.bytes.data() + dst * es, es) != 0) {
        return AssertionFailure() << "out[" << c << "][" << r << "] = " << ElementString(out, dst)
                                  << ", expected in[" << r << "][" << c
                                  << "] = " << ElementString(x, src);
      }
    }
  }
  return AssertionSuccess();
}

// matmul: [M,K] x [K,N] -> FLOAT32 [M,N]; BFLOAT16 inputs are widened exactly, so the same
// float32-accumulation bound holds for both.
AssertionResult CheckMatmul(const std::vector<Tensor>& in, const Tensor& out, Inputs kind) {
  const Tensor &a = in[0], &b = in[1];
  const int64_t m = a.meta.shape[0], k = a.meta.shape[1], n = b.meta.shape[1];
  if (auto r = MetaIs(out, {DType::kFloat32, {m, n}}); !r) return r;
  std::vector<double> av(m * k), bv(k * n);
  for (int64_t i = 0; i < m * k; ++i) av[i] = At(a, i);
  for (int64_t i = 0; i < k * n; ++i) bv[i] = At(b, i);
  std::vector<double> want(m * n, 0.0), magnitude(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double aip = av[i * k + p];
      for (int64_t j = 0; j < n; ++j) {
        want[i * n + j] += aip * bv[p * n + j];
        magnitude[i * n + j] += std::abs(aip * bv[p * n + j]);
      }
    }
  }
  for (int64_t i = 0; i < m * n; ++i) {
    // k products and k - 1 additions, each rounded once in float32.
    const double tol = kind == Inputs::kExact ? 0.0 : Gamma(k + 1) * magnitude[i];
    if (auto r = Near("matmul", i, At(out, i), want[i], tol); !r) return r;
  }
  return AssertionSuccess();
}

// max / min (and per row): the extremum in the input's dtype, bit for bit. Floats: a NaN among
// the reduced elements gives the canonical NaN (FLOAT32 0x7FFFFFFF, BFLOAT16 0x7FFF, what the
// GPU's max.NaN gives), whatever its own bits; otherwise -0.0 orders below +0.0. Integers exact
// (compared as integers: INT64 beyond 2^53 would round as a double).
enum class Extremum { kMax, kMin };

// The bits expected of the extremum of x[begin, end) (end > begin), in x's element size.
uint64_t ExpectedExtremumBits(const Tensor& x, int64_t begin, int64_t end, Extremum which) {
  const bool max = which == Extremum::kMax;
  const size_t es = ElementSize(x.meta.dtype);
  int64_t best = -1;
  bool nan = false;
  for (int64_t i = begin; i < end; ++i) {
    if (IsInteger(x.meta.dtype)) {
      const int64_t v = IntAt(x, i);
      if (best < 0 || (max ? v > IntAt(x, best) : v < IntAt(x, best))) best = i;
      continue;
    }
    const double v = At(x, i);
    if (std::isnan(v)) {
      nan = true;
      continue;
    }
    if (best < 0) {
      best = i;
      continue;
    }
    const double b = At(x, best);
    const bool better = v == b ? std::signbit(v) != std::signbit(b) && std::signbit(v) != max
                               : (max ? v > b : v < b);
    if (better) best = i;
  }
  if (nan) return x.meta.dtype == DType::kFloat32 ? 0x7FFFFFFFu : 0x7FFFu;
  uint64_t bits = 0;
  std::memcpy(&bits, x.bytes.data() + best * es, es);
  return bits;
}

AssertionResult CheckExtremumRuns(const Tensor& x, const Tensor& out, int64_t runs,
                                  Extremum which, const char* what) {
  const int64_t len = runs == 0 ? 0 : x.meta.NumElements() / runs;
  const size_t es = ElementSize(x.meta.dtype);
  for (int64_t r = 0; r < runs; ++r) {
    const uint64_t want = ExpectedExtremumBits(x, r * len, (r + 1) * len, which);
    uint64_t got = 0;
    std::memcpy(&got, out.bytes.data() + r * es, es);
    if (got != want) {
      return AssertionFailure() << what << "[" << r << "] = " << ElementString(out, r)
                                << " (bits 0x" << std::hex << got << "), expected bits 0x" << want
                                << std::dec;
    }
  }
  return AssertionSuccess();
}

AssertionResult CheckExtremum(const std::vector<Tensor>& in, const Tensor& out, Extremum which) {
  if (auto r = MetaIs(out, {in[0].meta.dtype, {}}); !r) return r;
  return CheckExtremumRuns(in[0], out, 1, which, which == Extremum::kMax ? "max" : "min");
}
AssertionResult CheckMax(const std::vector<Tensor>& in, const Tensor& out, Inputs) {
  return CheckExtremum(in, out, Extremum::kMax);
}
AssertionResult CheckMin(const std::vector<Tensor>& in, const Tensor& out, Inputs) {
  return CheckExtremum(in, out, Extremum::kMin);
}

AssertionResult CheckRowExtremum(const std::vector<Tensor>& in, const Tensor& out,
                                 Extremum which) {
  const int64_t rows = in[0].meta.shape[0];
  if (auto r = MetaIs(out, {in[0].meta.dtype, {rows}}); !r) return r;
  return CheckExtremumRuns(in[0], out, rows, which,
                           which == Extremum::kMax ? "row_max" : "row_min");
}
AssertionResult CheckRowMax(const std::vector<Tensor>& in, const Tensor& out, Inputs) {
  return CheckRowExtremum(in, out, Extremum::kMax);
}
AssertionResult CheckRowMin(const std::vector<Tensor>& in, const Tensor& out, Inputs) {
  return CheckRowExtremum(in, out, Extremum::kMin);
}

using Shapes = std::vector<std::vector<int64_t>>;  // one shape per input

struct OpModel {
  absl::string_view op;
  std::vector<Shapes> shapes;  // the cases each (row, dtype) runs on
  AssertionResult (*check)(const std::vector<Tensor>& in, const Tensor& out, Inputs kind);
  // A reduction without an identity (max, min): NaN propagates and empty reductions are
  // refused (CpuNaNTest, EmptyInputs below).
  bool no_identity = false;
};

Shapes MatmulShapes(int64_t m, int64_t k, int64_t n) { return {{m, k}, {k, n}}; }

// Sizes at the edges: 1, not a multiple of 32 (33, 127, 65, 129, 1023...), a tile exactly
// (64), and large (2^20 elements and more; 256^3 for matmul, what 2 CPU cores run quickly).
// clang-format off
const std::vector<OpModel>& Models() {
  static const std::vector<Shapes> kRowShapes = {
      {{1, 1}}, {{1, 33}}, {{33, 1}}, {{127, 33}}, {{3, 127}}, {{1024, 1024}}, {{1, 1000003}},
      {{100003, 3}}};
  static const std::vector<Shapes> kWholeShapes = {
      {{}}, {{1}}, {{33}}, {{127}}, {{1, 1, 1, 1}}, {{3, 33}}, {{2, 3, 5, 7}}, {{1 << 20}},
      {{1000003}}};
  static const auto* const kModels = new std::vector<OpModel>{
      {"sum", kWholeShapes, CheckSum},
      {"row_sum", kRowShapes, CheckRowSum},
      {"row_mean", kRowShapes, CheckRowMean},
      {"row_max", kRowShapes, CheckRowMax, /*no_identity=*/true},
      {"row_min", kRowShapes, CheckRowMin, /*no_identity=*/true},
      {"transpose", {{{1, 1}}, {{1, 33}}, {{33, 1}}, {{33, 127}}, {{127, 65}}, {{64, 64}},
                     {{65, 129}}, {{1023, 1025}}},
       CheckTranspose},
      {"max", kWholeShapes, CheckMax, /*no_identity=*/true},
      {"min", kWholeShapes, CheckMin, /*no_identity=*/true},
      {"matmul", {MatmulShapes(1, 1, 1), MatmulShapes(1, 33, 1), MatmulShapes(33, 1, 127),
                  MatmulShapes(33, 127, 65), MatmulShapes(64, 64, 64), MatmulShapes(65, 129, 33),
                  MatmulShapes(255, 257, 129), MatmulShapes(256, 256, 256)},
       CheckMatmul},
  };
  return *kModels;
}
// clang-format on

const OpModel* FindModel(absl::string_view op) {
  for (const OpModel& m : Models()) {
    if (m.op == op) return &m;
  }
  return nullptr;
}

// Fresh inputs for one case. The poison pattern (all 0xFF) is never drawn, so an unwritten
// output element can never equal the expected one by chance.
Tensor MakeInput(DType dtype, const std::vector<int64_t>& shape, Inputs kind,
                 std::mt19937_64& rng) {
  Tensor t = Empty(dtype, shape);
  const int64_t n = t.meta.NumElements();
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> small(1, 8), sign(0, 1);
  auto small_nonzero = [&] { return static_cast<float>(sign(rng) ? small(rng) : -small(rng)); };
  switch (dtype) {
    case DType::kFloat32:
      for (int64_t i = 0; i < n; ++i)
        Store<float>(t, i, kind == Inputs::kExact ? small_nonzero() : unit(rng));
      break;
    case DType::kBFloat16:
      // Truncating to the top 16 bits gives a value bfloat16 holds exactly.
      for (int64_t i = 0; i < n; ++i) {
        Store<uint16_t>(t, i, Bf16Bits(kind == Inputs::kExact ? small_nonzero() : unit(rng)));
      }
      break;
    case DType::kInt32: {
      constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
      // kExact: every term near INT32_MAX, so an int32 accumulator overflows from the 2nd term.
      std::uniform_int_distribution<int32_t> d(
          kind == Inputs::kExact ? kMax - 1000 : std::numeric_limits<int32_t>::min(), kMax);
      for (int64_t i = 0; i < n; ++i) {
        int32_t v = d(rng);
        while (v == -1) v = d(rng);  // all 0xFF: the poison
        Store<int32_t>(t, i, v);
      }
      break;
    }
    case DType::kInt64: {
      // kExact: magnitudes beyond 2^32, so a copy through 32 bits shows.
      std::uniform_int_distribution<int64_t> d(
          kind == Inputs::kExact ? int64_t{1} << 40 : std::numeric_limits<int64_t>::min(),
          kind == Inputs::kExact ? int64_t{1} << 62 : std::numeric_limits<int64_t>::max());
      for (int64_t i = 0; i < n; ++i) {
        int64_t v = d(rng);
        while (v == -1) v = d(rng);  // all 0xFF: the poison
        if (kind == Inputs::kExact && sign(rng)) v = -v;
        Store<int64_t>(t, i, v);
      }
      break;
    }
    case DType::kInvalid:
      ADD_FAILURE() << "MakeInput: invalid dtype";
      break;
  }
  return t;
}

std::string ShapeName(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (int64_t d : shape) absl::StrAppend(&s, s.empty() ? "" : "x", d);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Random and exact inputs: one test per (op, algorithm, dtype, shape).

struct KernelCase {
  const AlgoSpec* algo;
  DType dtype;
  Shapes shapes;
};

std::string Name(const AlgoSpec& a, DType d) {
  return absl::StrCat(a.op, "_", a.name, "_", DTypeName(d));
}

std::vector<KernelCase> KernelCases() {
  std::vector<KernelCase> cases;
  for (const AlgoSpec* a : CpuRows()) {
    const OpModel* model = FindModel(a->op);
    if (model == nullptr) continue;  // EveryCpuRowHasAModel fails instead
    for (DType d : a->dtypes) {
      for (const Shapes& s : model->shapes) cases.push_back({a, d, s});
    }
  }
  return cases;
}

class CpuKernelTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(CpuKernelTest, MatchesReference) {
  const KernelCase& c = GetParam();
  const OpModel* model = FindModel(c.algo->op);
  ASSERT_NE(model, nullptr);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (Inputs kind : {Inputs::kRandom, Inputs::kExact}) {
    SCOPED_TRACE(kind == Inputs::kRandom ? "random inputs" : "exact inputs");
    std::vector<Tensor> inputs;
    for (const auto& shape : c.shapes) inputs.push_back(MakeInput(c.dtype, shape, kind, rng));
    absl::StatusOr<Tensor> out = RunRow(*c.algo, inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(model->check(inputs, *out, kind));
  }
}

INSTANTIATE_TEST_SUITE_P(CpuRows, CpuKernelTest, ::testing::ValuesIn(KernelCases()),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           std::string shapes;
                           for (const auto& s : info.param.shapes)
                             absl::StrAppend(&shapes, "_", ShapeName(s));
                           return absl::StrCat(Name(*info.param.algo, info.param.dtype), shapes);
                         });

// ---------------------------------------------------------------------------------------------
// Hand-computed cases, run on every cpu row of their op that accepts their dtype.

struct HandCase {
  std::string name;
  absl::string_view op;
  std::vector<Tensor> inputs;
  Tensor expected;
};

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();

const std::vector<HandCase>& HandCases() {
  static const auto* const kCases = new std::vector<HandCase>{
      // sum
      {"f32_vector", "sum", {F32({4}, {1, 2, 3, 4})}, F32({}, {10})},
      {"f32_scalar", "sum", {F32({}, {-2.5f})}, F32({}, {-2.5f})},
      {"f32_rank4", "sum", {F32({1, 2, 1, 2}, {0.5f, 0.25f, -1, 4})}, F32({}, {3.75f})},
      {"f32_cancels", "sum", {F32({3}, {0.75f, -0.5f, -0.25f})}, F32({}, {0})},
      {"i32_over_int32_max", "sum", {I32({3}, {kI32Max, kI32Max, 2})}, I64({}, {4294967296})},
      {"i32_under_int32_min",
       "sum",
       {I32({2, 2}, {kI32Min, kI32Min, kI32Min, -5})},
       I64({}, {-6442450949})},
      {"i32_scalar", "sum", {I32({}, {7})}, I64({}, {7})},
      {"i32_mixed", "sum", {I32({5}, {1, -2, 3, -4, 100})}, I64({}, {98})},
      {"i64_past_int32", "sum", {I64({3}, {int64_t{1} << 40, -5, int64_t{1} << 33})},
       I64({}, {(int64_t{1} << 40) + (int64_t{1} << 33) - 5})},
      // numpy: np.array([2**62, 2**62], np.int64).sum() == -2**63 (wraps, no error).
      {"i64_wraps", "sum", {I64({2}, {int64_t{1} << 62, int64_t{1} << 62})},
       I64({}, {std::numeric_limits<int64_t>::min()})},
      {"bf16_vector", "sum", {Bf16({4}, {1, 2.5f, -0.5f, 4})}, F32({}, {7})},
      // row_sum / row_mean
      {"f32_2x3", "row_sum", {F32({2, 3}, {1, 2, 3, 4, 5, 6})}, F32({2}, {6, 15})},
      {"f32_1x1", "row_sum", {F32({1, 1}, {-3})}, F32({1}, {-3})},
      {"f32_3x1", "row_sum", {F32({3, 1}, {1, -2, 3})}, F32({3}, {1, -2, 3})},
      {"f32_2x3", "row_mean", {F32({2, 3}, {1, 2, 3, 4, 5, 6})}, F32({2}, {2, 5})},
      {"f32_1x4", "row_mean", {F32({1, 4}, {1, 2, 3, 5})}, F32({1}, {2.75f})},
      {"f32_3x1", "row_mean", {F32({3, 1}, {1, -2, 3})}, F32({3}, {1, -2, 3})},
      {"i32_2x2", "row_sum", {I32({2, 2}, {kI32Max, kI32Max, kI32Min, -1})},
       I64({2}, {int64_t{2} * kI32Max, int64_t{kI32Min} - 1})},
      {"i64_2x2", "row_sum", {I64({2, 2}, {int64_t{1} << 62, int64_t{1} << 62, 5, -7})},
       I64({2}, {std::numeric_limits<int64_t>::min(), -2})},
      {"bf16_2x2", "row_sum", {Bf16({2, 2}, {1, 2.5f, -0.5f, 4})}, F32({2}, {3.5f, 3.5f})},
      // The sum is taken exactly before the division: (INT32_MAX + INT32_MAX) / 2, no overflow.
      {"i32_1x2", "row_mean", {I32({1, 2}, {kI32Max, kI32Max})},
       F32({1}, {static_cast<float>(kI32Max)})},
      {"i64_2x4", "row_mean", {I64({2, 4}, {1, 2, 3, 4, -8, 0, 0, 2})}, F32({2}, {2.5f, -1.5f})},
      {"bf16_1x4", "row_mean", {Bf16({1, 4}, {1, 2, 3, 5})}, F32({1}, {2.75f})},
      // transpose, every dtype
      {"f32_2x3", "transpose", {F32({2, 3}, {1, 2, 3, 4, 5, 6})}, F32({3, 2}, {1, 4, 2, 5, 3, 6})},
      {"f32_1x2", "transpose", {F32({1, 2}, {1, 3})}, F32({2, 1}, {1, 3})},
      {"i32_2x3",
       "transpose",
       {I32({2, 3}, {1, -2, 3, kI32Max, kI32Min, 6})},
       I32({3, 2}, {1, kI32Max, -2, kI32Min, 3, 6})},
      {"i64_3x2",
       "transpose",
       {I64({3, 2}, {int64_t{1} << 40, -(int64_t{1} << 41) + 3, 5, int64_t{1} << 62, -7, 8})},
       I64({2, 3}, {int64_t{1} << 40, 5, -7, -(int64_t{1} << 41) + 3, int64_t{1} << 62, 8})},
      {"bf16_2x3",
       "transpose",
       {Bf16({2, 3}, {1, 2, 3, -0.5f, 0.25f, 6})},
       Bf16({3, 2}, {1, -0.5f, 2, 0.25f, 3, 6})},
      // matmul
      {"f32_2x2x2",
       "matmul",
       {F32({2, 2}, {1, 2, 3, 4}), F32({2, 2}, {5, 6, 7, 8})},
       F32({2, 2}, {19, 22, 43, 50})},
      {"f32_1x3x1", "matmul", {F32({1, 3}, {1, 2, 3}), F32({3, 1}, {4, 5, 6})}, F32({1, 1}, {32})},
      {"f32_2x3x2",
       "matmul",
       {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({3, 2}, {7, 8, 9, 10, 11, 12})},
       F32({2, 2}, {58, 64, 139, 154})},
      {"f32_3x1x2",
       "matmul",
       {F32({3, 1}, {1, -2, 3}), F32({1, 2}, {0.5f, 4})},
       F32({3, 2}, {0.5f, 4, -1, -8, 1.5f, 12})},
      {"bf16_2x2x2",
       "matmul",
       {Bf16({2, 2}, {1, 2, 3, 4}), Bf16({2, 2}, {5, 6, 7, 8})},
       F32({2, 2}, {19, 22, 43, 50})},
      {"bf16_1x2x1",
       "matmul",
       {Bf16({1, 2}, {0.5f, -1.5f}), Bf16({2, 1}, {2, 4})},
       F32({1, 1}, {-5})},
      // max: the input's dtype; signed zeros ordered; integers compared exactly
      {"f32_vector", "max", {F32({4}, {-3, 7.5f, 2, 7.25f})}, F32({}, {7.5f})},
      {"f32_all_negative", "max", {F32({2, 2}, {-3, -1.5f, -2, -8})}, F32({}, {-1.5f})},
      {"f32_zeros", "max", {F32({3}, {-0.0f, 0.0f, -0.0f})}, F32({}, {0.0f})},
      {"f32_scalar", "max", {F32({}, {-2.5f})}, F32({}, {-2.5f})},
      {"f32_infinity", "max", {F32({2}, {-INFINITY, 1})}, F32({}, {1})},
      {"i32_limits", "max", {I32({3}, {kI32Min, -5, kI32Min})}, I32({}, {-5})},
      {"i32_max", "max", {I32({2, 2}, {kI32Max, 3, -7, kI32Max - 1})}, I32({}, {kI32Max})},
      // Past 2^53, where a comparison through double would call the two equal.
      {"i64_past_2_53", "max",
       {I64({3}, {(int64_t{1} << 62) + 1, int64_t{1} << 62, -(int64_t{1} << 62)})},
       I64({}, {(int64_t{1} << 62) + 1})},
      {"bf16_vector", "max", {Bf16({4}, {1, 2.5f, -0.5f, 4})}, Bf16({}, {4})},
      // min
      {"f32_vector", "min", {F32({4}, {3, -7.5f, 2, -7.25f})}, F32({}, {-7.5f})},
      {"f32_all_positive", "min", {F32({2, 2}, {3, 1.5f, 2, 8})}, F32({}, {1.5f})},
      {"f32_zeros", "min", {F32({3}, {0.0f, -0.0f, 0.0f})}, F32({}, {-0.0f})},
      {"f32_infinity", "min", {F32({2}, {INFINITY, -1})}, F32({}, {-1})},
      {"i32_limits", "min", {I32({3}, {kI32Max, 5, kI32Max})}, I32({}, {5})},
      {"i32_min", "min", {I32({2, 2}, {kI32Min, 3, -7, kI32Min + 1})}, I32({}, {kI32Min})},
      {"i64_past_2_53", "min",
       {I64({3}, {-(int64_t{1} << 62) - 1, -(int64_t{1} << 62), int64_t{1} << 62})},
       I64({}, {-(int64_t{1} << 62) - 1})},
      {"bf16_vector", "min", {Bf16({4}, {1, 2.5f, -0.5f, 4})}, Bf16({}, {-0.5f})},
      // row_max
      {"f32_2x3", "row_max", {F32({2, 3}, {1, 5, 3, -4, -6, -5})}, F32({2}, {5, -4})},
      {"f32_3x1", "row_max", {F32({3, 1}, {1, -2, 3})}, F32({3}, {1, -2, 3})},
      {"f32_zeros", "row_max", {F32({2, 2}, {-0.0f, 0.0f, -0.0f, -0.0f})},
       F32({2}, {0.0f, -0.0f})},
      {"i32_2x2", "row_max", {I32({2, 2}, {kI32Min, kI32Min + 1, kI32Max, -1})},
       I32({2}, {kI32Min + 1, kI32Max})},
      {"i64_2x2", "row_max",
       {I64({2, 2}, {(int64_t{1} << 62) + 1, int64_t{1} << 62, -5, -7})},
       I64({2}, {(int64_t{1} << 62) + 1, -5})},
      {"bf16_2x2", "row_max", {Bf16({2, 2}, {1, 2.5f, -0.5f, -4})}, Bf16({2}, {2.5f, -0.5f})},
      // row_min
      {"f32_2x3", "row_min", {F32({2, 3}, {1, 5, 3, -4, -6, -5})}, F32({2}, {1, -6})},
      {"f32_3x1", "row_min", {F32({3, 1}, {1, -2, 3})}, F32({3}, {1, -2, 3})},
      {"f32_zeros", "row_min", {F32({2, 2}, {0.0f, -0.0f, 0.0f, 0.0f})},
       F32({2}, {-0.0f, 0.0f})},
      {"i32_2x2", "row_min", {I32({2, 2}, {kI32Max, kI32Max - 1, kI32Min, 1})},
       I32({2}, {kI32Max - 1, kI32Min})},
      {"i64_2x2", "row_min",
       {I64({2, 2}, {-(int64_t{1} << 62) - 1, -(int64_t{1} << 62), 5, 7})},
       I64({2}, {-(int64_t{1} << 62) - 1, 5})},
      {"bf16_2x2", "row_min", {Bf16({2, 2}, {1, 2.5f, -0.5f, -4})}, Bf16({2}, {1, -4})},
  };
  return *kCases;
}

bool Accepts(const AlgoSpec& a, DType d) {
  return std::find(a.dtypes.begin(), a.dtypes.end(), d) != a.dtypes.end();
}

struct HandParam {
  const AlgoSpec* algo;
  const HandCase* hand;
};

std::vector<HandParam> HandParams() {
  std::vector<HandParam> params;
  for (const AlgoSpec* a : CpuRows()) {
    for (const HandCase& h : HandCases()) {
      if (h.op == a->op && Accepts(*a, h.inputs[0].meta.dtype)) params.push_back({a, &h});
    }
  }
  return params;
}

class CpuKernelHandTest : public ::testing::TestWithParam<HandParam> {};

TEST_P(CpuKernelHandTest, MatchesHandComputed) {
  const HandCase& h = *GetParam().hand;
  absl::StatusOr<Tensor> out = RunRow(*GetParam().algo, h.inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->meta, h.expected.meta)
      << "got " << out->meta.DebugString() << ", expected " << h.expected.meta.DebugString();
  if (FindOp(h.op)->test.error_scale == ErrorScale::kExact) {  // max, min: the bits, -0.0 too
    EXPECT_EQ(out->bytes, h.expected.bytes);
  }
  for (int64_t i = 0; i < h.expected.meta.NumElements(); ++i) {
    if (IsInteger(h.expected.meta.dtype)) {
      EXPECT_EQ(IntAt(*out, i), IntAt(h.expected, i)) << "element " << i;
    } else {
      // Hand cases are exact in any order of evaluation: equality, and NaN fails it.
      EXPECT_EQ(At(*out, i), At(h.expected, i)) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuRows, CpuKernelHandTest, ::testing::ValuesIn(HandParams()),
                         [](const ::testing::TestParamInfo<HandParam>& info) {
                           return absl::StrCat(info.param.algo->op, "_", info.param.algo->name, "_",
                                               info.param.hand->name);
                         });

// ---------------------------------------------------------------------------------------------
// The table itself: nothing in it escapes the tests above.

TEST(OpTable, EveryCpuRowHasAModel) {
  for (const AlgoSpec* a : CpuRows()) {
    EXPECT_NE(FindModel(a->op), nullptr)
        << "cpu row " << a->op << "/" << a->name
        << " has no reference in op_reference_test.cc: add the op's meaning to Models()";
  }
}

TEST(OpTable, EveryCpuRowDtypeHasAHandCase) {
  for (const AlgoSpec* a : CpuRows()) {
    for (DType d : a->dtypes) {
      bool found = false;
      for (const HandCase& h : HandCases()) found |= (h.op == a->op && h.inputs[0].meta.dtype == d);
      EXPECT_TRUE(found) << "no hand-computed case for " << a->op << "/" << a->name << " on "
                         << DTypeName(d);
    }
  }
}

TEST(OpTable, EveryOpHasExactlyOneDefaultReferenceRowOnCpu) {
  for (const OpSpec& op : Ops()) {
    int defaults = 0;
    bool reference = false;
    for (const AlgoSpec* a : CpuRows()) {
      if (a->op != op.name) continue;
      defaults += a->is_default;
      reference |= (a->name == "reference" && a->is_default);
    }
    EXPECT_EQ(defaults, 1) << op.name;
    EXPECT_TRUE(reference) << op.name << ": the cpu backend's default must be 'reference'";
  }
}

TEST(OpTable, RowsAgreeWithTheirOp) {
  for (const AlgoSpec& a : Algorithms()) {
    const OpSpec* op = FindOp(a.op);
    ASSERT_NE(op, nullptr) << "row " << a.op << "/" << a.name << " names an unknown op";
    EXPECT_NE(a.run, nullptr) << a.op << "/" << a.name;
    EXPECT_FALSE(a.dtypes.empty()) << a.op << "/" << a.name;
    for (DType d : a.dtypes) {
      EXPECT_TRUE(std::find(op->dtypes.begin(), op->dtypes.end(), d) != op->dtypes.end())
          << a.op << "/" << a.name << " runs " << DTypeName(d) << ", which the op does not list";
    }
  }
}

TEST(OpTable, CpuRowsCoverEveryDtypeOfEveryOp) {
  for (const OpSpec& op : Ops()) {
    for (DType d : op.dtypes) {
      bool covered = false;
      for (const AlgoSpec* a : CpuRows()) covered |= (a->op == op.name && Accepts(*a, d));
      EXPECT_TRUE(covered) << op.name << " on " << DTypeName(d) << " has no cpu row";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The harness itself: broken kernels must fail the checks above, or a pass means nothing.

AlgoSpec Broken(absl::string_view op, KernelFn run) {
  return {.op = op, .name = "broken", .backend = "cpu", .dtypes = {DType::kFloat32}, .run = run,
          .description = "test double"};
}

AssertionResult CheckBroken(const AlgoSpec& algo, const Shapes& shapes) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Tensor> inputs;
  for (const auto& shape : shapes)
    inputs.push_back(MakeInput(DType::kFloat32, shape, Inputs::kExact, rng));
  absl::StatusOr<Tensor> out = RunRow(algo, inputs);
  if (!out.ok()) return AssertionFailure() << out.status();
  return FindModel(algo.op)->check(inputs, *out, Inputs::kExact);
}

TEST(Harness, AnUnwrittenOutputFails) {
  const AlgoSpec nothing = Broken("row_sum", [](const KernelArgs&) { return absl::OkStatus(); });
  EXPECT_FALSE(CheckBroken(nothing, {{3, 5}}));
}

TEST(Harness, OneUnwrittenElementFails) {
  const AlgoSpec short_by_one = Broken("transpose", [](const KernelArgs& a) {
    const int64_t n = a.output_meta.NumElements();
    std::vector<float> tmp(n);
    KernelArgs args{a.inputs, a.input_meta, tmp.data(), a.output_meta, a.attrs, a.env};
    absl::Status s = CpuReference("transpose")->run(args);
    std::memcpy(a.output, tmp.data(), (n - 1) * sizeof(float));
    return s;
  });
  EXPECT_FALSE(CheckBroken(short_by_one, {{33, 65}}));
}

TEST(Harness, AWritePastTheEndFails) {
  const AlgoSpec overrun = Broken("row_mean", [](const KernelArgs& a) {
    absl::Status s = CpuReference("row_mean")->run(a);
    static_cast<float*>(a.output)[a.output_meta.NumElements()] = 0.f;
    return s;
  });
  absl::StatusOr<Tensor> out = RunRow(overrun, {F32({2, 2}, {1, 2, 3, 4})});
  EXPECT_FALSE(out.ok());
}

TEST(Harness, ADroppedTermFails) {
  const AlgoSpec drops_last_k = Broken("matmul", [](const KernelArgs& a) {
    // A[:, :K-1] x B[:K-1, :] through the real kernel: one term short everywhere.
    const int64_t m = a.input_meta[0].shape[0], k = a.input_meta[0].shape[1];
    std::vector<float> a_short;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p + 1 < k; ++p)
        a_short.push_back(static_cast<const float*>(a.inputs[0])[i * k + p]);
    }
    std::vector<TensorMeta> metas = {{DType::kFloat32, {m, k - 1}},
                                     {DType::kFloat32, {k - 1, a.input_meta[1].shape[1]}}};
    const void* ptrs[] = {a_short.data(), a.inputs[1]};
    KernelArgs args{ptrs, metas, a.output, a.output_meta, a.attrs, a.env};
    return CpuReference("matmul")->run(args);
  });
  EXPECT_FALSE(CheckBroken(drops_last_k, MatmulShapes(33, 127, 65)));
}

TEST(Harness, NaNNeverPasses) {
  EXPECT_FALSE(Near("x", 0, std::nan(""), 1.0, 1e30));
  EXPECT_FALSE(Near("x", 0, std::nan(""), std::nan(""), 1e30));
  EXPECT_TRUE(Near("x", 0, 1.0, 1.0, 0.0));
}

// ---------------------------------------------------------------------------------------------
// NaN and empty inputs of the reductions without an identity (max, min, row_max, row_min): the
// ops this file's models mark so.

// Quiet, negative and payload-carrying NaNs, one for each position: none is the canonical NaN
// the output must hold, nor the poison.
constexpr uint32_t kF32NaNs[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u};
constexpr uint16_t kBf16NaNs[] = {0x7FC0u, 0xFFC1u, 0x7F81u};

struct NaNParam {
  const AlgoSpec* algo;
  DType dtype;
  Shapes shapes;
  int at;  // 0: the first element, 1: a middle one, 2: the last
};

std::vector<NaNParam> NaNParams() {
  std::vector<NaNParam> params;
  for (const AlgoSpec* a : CpuRows()) {
    const OpModel* model = FindModel(a->op);
    if (model == nullptr || !model->no_identity) continue;
    for (DType d : {DType::kFloat32, DType::kBFloat16}) {
      if (!Accepts(*a, d)) continue;
      for (const Shapes& s : model->shapes) {
        for (int at = 0; at < 3; ++at) params.push_back({a, d, s, at});
      }
    }
  }
  return params;
}

class CpuNaNTest : public ::testing::TestWithParam<NaNParam> {};

// A NaN at the first, a middle or the last element (for the row ops: of the first row, a middle
// row, the last row) gives the canonical NaN where it is reduced, and leaves every other output
// as the model says.
TEST_P(CpuNaNTest, Propagates) {
  const NaNParam& p = GetParam();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  std::vector<Tensor> in = {MakeInput(p.dtype, p.shapes[0], Inputs::kRandom, rng)};
  const int64_t n = in[0].meta.NumElements();
  const int64_t index = p.at == 0 ? 0 : p.at == 1 ? n / 2 : n - 1;
  if (p.dtype == DType::kFloat32) {
    std::memcpy(in[0].bytes.data() + index * 4, &kF32NaNs[p.at], 4);
  } else {
    std::memcpy(in[0].bytes.data() + index * 2, &kBf16NaNs[p.at], 2);
  }
  absl::StatusOr<Tensor> out = RunRow(*p.algo, in);
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t outputs = out->meta.NumElements();
  const int64_t nan_output = outputs == 1 ? 0 : index / (n / outputs);
  EXPECT_TRUE(std::isnan(At(*out, nan_output))) << "output " << nan_output << " is not NaN";
  EXPECT_TRUE(FindModel(p.algo->op)->check(in, *out, Inputs::kRandom));
}

INSTANTIATE_TEST_SUITE_P(CpuRows, CpuNaNTest, ::testing::ValuesIn(NaNParams()),
                         [](const ::testing::TestParamInfo<NaNParam>& info) {
                           std::string shapes;
                           for (const auto& s : info.param.shapes)
                             absl::StrAppend(&shapes, "_", ShapeName(s));
                           return absl::StrCat(Name(*info.param.algo, info.param.dtype), shapes,
                                               "_nan_", info.param.at == 0   ? "first"
                                                        : info.param.at == 1 ? "middle"
                                                                             : "last");
                         });

// numpy's np.max(np.zeros(0)) raises "zero-size array to reduction operation maximum which has
// no identity": the shape rule of every such op refuses an empty reduction with
// INVALID_ARGUMENT naming the op and the input, in every dtype. Rows [0, C] reduce nothing and
// give an empty [0]; the cpu row runs them without writing.
TEST(EmptyInputs, ReductionsWithoutIdentityRefuseThem) {
  int checked = 0;
  for (const OpModel& m : Models()) {
    if (!m.no_identity) continue;
    const OpSpec* op = FindOp(m.op);
    ASSERT_NE(op, nullptr) << m.op;
    const bool rows = m.shapes[0][0].size() == 2;
    const std::vector<std::vector<int64_t>> refused =
        rows ? std::vector<std::vector<int64_t>>{{3, 0}, {1, 0}}
             : std::vector<std::vector<int64_t>>{{0}, {4, 0}, {0, 3, 2}};
    for (DType d : op->dtypes) {
      for (const auto& shape : refused) {
        const std::vector<TensorMeta> in = {{d, shape}};
        absl::StatusOr<TensorMeta> out = op->infer(in);
        SCOPED_TRACE(absl::StrCat(m.op, " of ", in[0].DebugString()));
        ASSERT_FALSE(out.ok());
        EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(out.status().message().find(m.op), absl::string_view::npos)
            << out.status().message();
        EXPECT_NE(out.status().message().find("input 0"), absl::string_view::npos)
            << out.status().message();
        EXPECT_NE(out.status().message().find("zero-size"), absl::string_view::npos)
            << out.status().message();
        ++checked;
      }
      if (!rows) continue;
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0, 5}, {0, 0}}) {
        const std::vector<Tensor> in = {Empty(d, shape)};
        SCOPED_TRACE(absl::StrCat(m.op, " of ", in[0].meta.DebugString()));
        for (const AlgoSpec* a : CpuRows()) {
          if (a->op != m.op) continue;
          absl::StatusOr<Tensor> out = RunRow(*a, in);
          ASSERT_TRUE(out.ok()) << out.status();
          EXPECT_EQ(out->meta, (TensorMeta{d, {0}}));
        }
      }
    }
  }
  EXPECT_GE(checked, 4 * 2 * 2 + 4 * 2 * 3) << "fewer ops without identity than the table has";
}

// A max that lets a NaN through as fmaxf does (the non-NaN operand wins) must fail the model.
TEST(Harness, AMaxThatDropsNaNFails) {
  const AlgoSpec fmax_like = Broken("max", [](const KernelArgs& a) {
    const auto* x = static_cast<const float*>(a.inputs[0]);
    float m = -INFINITY;
    for (int64_t i = 0; i < a.input_meta[0].NumElements(); ++i) m = std::fmax(m, x[i]);
    *static_cast<float*>(a.output) = m;
    return absl::OkStatus();
  });
  std::vector<Tensor> in = {F32({3}, {1, 2, 3})};
  std::memcpy(in[0].bytes.data() + 4, &kF32NaNs[0], 4);
  absl::StatusOr<Tensor> out = RunRow(fmax_like, in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(FindModel("max")->check(in, *out, Inputs::kRandom));
  // And one that returns some NaN, but not the canonical one, fails as well.
  const AlgoSpec payload = Broken("max", [](const KernelArgs& a) {
    std::memcpy(a.output, &kF32NaNs[1], 4);
    return absl::OkStatus();
  });
  out = RunRow(payload, in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(FindModel("max")->check(in, *out, Inputs::kRandom));
}

}  // namespace
}  // namespace opserve
