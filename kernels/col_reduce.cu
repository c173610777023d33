// Column sums and means (kernels/col_reduce.h), in two kernels:
//   1. col_partials: the grid is column strips x chunks of rows. A thread owns `vecs` 16-byte
//      vectors of columns side by side (kLanes each: 4 floats, 8 bf16, 4 int32, 2 int64) where
//      every row is 16-byte aligned, else one column, and walks its chunk's rows `unroll` at a
//      time, all loads issued before any is added, so a warp reads 512 * vecs contiguous bytes
//      per row (128 unaligned). Its sums go to the scratch row of its chunk.
//   2. col_finish: each column's chunk sums added in chunk order, then RowFinish (the mean's
//      scale, or the exact integer division) as the row launchers apply it.
// Grid sizing: enough chunks that strips x chunks fill every SM `blocks_per_sm` times, with at
// least kMinRowsPerChunk rows a chunk, so the scratch stays a small fraction of the input
// (8192^2 floats at 2 blocks per SM: 33 chunks, 1 MiB of partials against 256 MiB read). The knobs are
// kernels/col_reduce_tuning.h's; kDefaultTuning is what the sweep chose.
// Accumulation: float for FLOAT32 and BFLOAT16 (a running sum per column over its chunk's rows,
// then the chunk sums), int64 for the integers (exact, wrapping modulo 2^64 as numpy's does).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/col_reduce.h"
#include "kernels/col_reduce_tuning.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace {

// Column sums and means accumulate as the reduction family's Sum does (reduce_op.cuh).
template <typename In>
using AccT = row_reduce::AccT<Sum, In>;
using row_reduce::kLanes;
using row_reduce::VecT;

constexpr int kThreads = 256;
constexpr int kMinBlocksPerSm = 2;  // __launch_bounds__: <= 128 registers a thread
constexpr int64_t kMinRowsPerChunk = 16;
// What ColReduce runs: the fastest on the H200 at 8192^2 and 65536 x 4096 (0.946x and 0.964x
// the read stream; 4 blocks per SM gave 0.873x and 0.939x, wider vectors less). opserve-bench
// --ops=col_sweep times the others.
constexpr ColReduceTuning kDefaultTuning{.vecs = 1, .unroll = 8, .blocks_per_sm = 2};

// One thread's columns at row r: kVecs 16-byte vectors side by side (kVec), or one element.
template <typename In, bool kVec, int kVecs>
struct Cols {
  static constexpr int kPerLoad = kVec ? kLanes<In> : 1;
  static constexpr int kN = kPerLoad * kVecs;  // columns a thread owns
  using Load = std::conditional_t<kVec, VecT<In>, In>;
  __device__ __forceinline__ static void Add(const Load& v, AccT<In>* acc) {
    if constexpr (kVec) {
      AccT<In> a[kPerLoad];
      row_reduce::VecToAcc<Sum, In>(v, a);
#pragma unroll
      for (int e = 0; e < kPerLoad; ++e) acc[e] += a[e];
    } else {
      acc[0] += reduce::ToAcc<Sum>(v);
    }
  }
};

template <typename In, bool kVec, int kVecs, int kUnroll>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    col_partials(const In* __restrict__ x, AccT<In>* __restrict__ partial, int64_t rows,
                 int64_t cols, int64_t rows_per_chunk) {
  using C = Cols<In, kVec, kVecs>;
  using Load = typename C::Load;
  constexpr int kP = C::kPerLoad;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t col0 = slot * C::kN;
  if (col0 >= cols) return;
  // Vectors of this thread that lie inside the row (the last thread's may not all).
  int vecs = kVecs;
  if constexpr (kVecs > 1) {
    const int64_t left = (cols - col0) / kP;
    vecs = left < kVecs ? static_cast<int>(left) : kVecs;
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  // Rows in units of Load: a row is cols / kP of them.
  const int64_t stride = cols / kP;
  const Load* p = reinterpret_cast<const Load*>(x) + r0 * stride + slot * kVecs;
  AccT<In> acc[C::kN];
#pragma unroll
  for (int e = 0; e < C::kN; ++e) acc[e] = AccT<In>(0);
  int64_t r = r0;
  if (vecs == kVecs) {
    for (; r + kUnroll <= r1; r += kUnroll, p += kUnroll * stride) {
      Load v[kUnroll][kVecs];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int w = 0; w < kVecs; ++w) v[u][w] = row_reduce::LoadStreaming(p + u * stride + w);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int w = 0; w < kVecs; ++w) C::Add(v[u][w], acc + w * kP);
      }
    }
  }
  for (; r < r1; ++r, p += stride) {
#pragma unroll
    for (int w = 0; w < kVecs; ++w) {
      if (w < vecs) C::Add(row_reduce::LoadStreaming(p + w), acc + w * kP);
    }
  }
  AccT<In>* out = partial + static_cast<int64_t>(blockIdx.y) * cols + col0;
#pragma unroll
  for (int e = 0; e < C::kN; ++e) {
    if (e < vecs * kP) out[e] = acc[e];
  }
}

template <typename Acc, typename Out, typename Finish>
__global__ void __launch_bounds__(kThreads)
    col_finish(const Acc* __restrict__ partial, Out* __restrict__ out, int64_t cols,
               int64_t chunks, Finish finish) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  Acc s = Acc(0);
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
  out[c] = finish(s);
}

// The grid of a tuning: strips of kThreads slots across the columns, chunks of rows down them.
struct Grid {
  int64_t strips = 0, chunks = 0, rows_per_chunk = 0;
};
Grid GridFor(int64_t rows, int64_t slots, int sm_count, int blocks_per_sm) {
  Grid g;
  g.strips = CeilDiv<int64_t>(std::max<int64_t>(slots, 1), kThreads);
  const int64_t want = CeilDiv<int64_t>(int64_t{sm_count} * std::max(blocks_per_sm, 1), g.strips);
  const int64_t r = std::max<int64_t>(rows, 1);
  int64_t per = std::max(kMinRowsPerChunk, CeilDiv<int64_t>(r, want));
  // gridDim.y is at most 65535: longer matrices take longer chunks.
  if (CeilDiv<int64_t>(r, per) > 65535) per = CeilDiv<int64_t>(r, 65535);
  g.rows_per_chunk = per;
  g.chunks = CeilDiv<int64_t>(r, per);
  return g;
}

template <typename In, bool kVec, int kVecs, int kUnroll>
cudaError_t LaunchPartials(dim3 grid, const In* d_in, AccT<In>* partial, int64_t rows, int64_t cols,
                           int64_t per_chunk, cudaStream_t stream) {
  col_partials<In, kVec, kVecs, kUnroll><<<grid, kThreads, 0, stream>>>(d_in, partial, rows, cols,
                                                                        per_chunk);
  return LastLaunchError();
}

// The vectorized partial kernels a tuning can name: every (vecs, unroll) for FLOAT32, the
// default for the other types (the sweep times FLOAT32).
template <typename In>
cudaError_t LaunchVec(const ColReduceTuning& t, dim3 grid, const In* d_in, AccT<In>* partial,
                      int64_t rows, int64_t cols, int64_t per_chunk, cudaStream_t stream) {
  constexpr ColReduceTuning d = kDefaultTuning;
  if constexpr (std::is_same_v<In, float>) {
#define OPSERVE_COL_CASE(V, U)                                                                    \
  if (t.vecs == V && t.unroll == U)                                                              \
    return LaunchPartials<In, true, V, U>(grid, d_in, partial, rows, cols, per_chunk, stream);
    OPSERVE_COL_CASE(1, 4) OPSERVE_COL_CASE(1, 8) OPSERVE_COL_CASE(1, 16)
    OPSERVE_COL_CASE(2, 4) OPSERVE_COL_CASE(2, 8) OPSERVE_COL_CASE(2, 16)
    OPSERVE_COL_CASE(4, 2) OPSERVE_COL_CASE(4, 4) OPSERVE_COL_CASE(4, 8)
#undef OPSERVE_COL_CASE
    return cudaErrorInvalidValue;
  } else {
    if (t.vecs != d.vecs || t.unroll != d.unroll) return cudaErrorInvalidValue;
    return LaunchPartials<In, true, d.vecs, d.unroll>(grid, d_in, partial, rows, cols, per_chunk,
                                                      stream);
  }
}

template <typename In, typename Out>
cudaError_t ColReduceImpl(const ColReduceTuning& t, void* d_temp, size_t* temp_bytes,
                          const In* d_in, Out* d_out, int64_t rows, int64_t cols, bool mean,
                          cudaStream_t stream) {
  using Acc = AccT<In>;
  // `mean` must fit the output type: an integer column sum has INT64 output, a mean FLOAT32.
  if (mean ? !std::is_same_v<Out, float> : !std::is_same_v<Out, Acc>) return cudaErrorInvalidValue;
  const bool vec = cols % kLanes<In> == 0 && reinterpret_cast<uintptr_t>(d_in) % 16 == 0;
  const int64_t slots = vec ? CeilDiv<int64_t>(cols / kLanes<In>, t.vecs) : cols;
  int sm_count = 0;
  if (const cudaError_t err = row_reduce::CurrentSmCount(&sm_count); err != cudaSuccess) return err;
  const Grid g = GridFor(rows, slots, sm_count, t.blocks_per_sm);
  const size_t need = static_cast<size_t>(g.chunks) * static_cast<size_t>(std::max<int64_t>(cols, 1)) * sizeof(Acc);
  if (d_temp == nullptr) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) return cudaErrorInvalidValue;
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  auto* partial = static_cast<Acc*>(d_temp);
  const dim3 grid(static_cast<unsigned>(g.strips), static_cast<unsigned>(g.chunks));
  const cudaError_t err =
      vec ? LaunchVec<In>(t, grid, d_in, partial, rows, cols, g.rows_per_chunk, stream)
          : LaunchPartials<In, false, 1, kDefaultTuning.unroll>(grid, d_in, partial, rows, cols,
                                                                g.rows_per_chunk, stream);
  if (err != cudaSuccess) return err;
  // Each output reduces `rows` elements: the count a mean divides by.
  auto finish_with = [&](auto finish) {
    col_finish<Acc, Out><<<static_cast<unsigned>(CeilDiv<int64_t>(cols, kThreads)), kThreads, 0,
                           stream>>>(partial, d_out, cols, g.chunks, finish);
    return LastLaunchError();
  };
  if constexpr (std::is_same_v<Out, float>) {
    if (mean) return finish_with(row_reduce::RowFinish<Mean, float>::Make(rows));
  }
  if constexpr (std::is_same_v<Out, Acc>) {
    return finish_with(row_reduce::RowFinish<Sum, Out>::Make(rows));
  }
  return cudaErrorInvalidValue;
}

}  // namespace

ColReduceTuning ColReduceDefaultTuning() { return kDefaultTuning; }

cudaError_t ColReduceTuned(const ColReduceTuning& tuning, void* d_temp, size_t* temp_bytes,
                           const float* d_in, float* d_out, int64_t rows, int64_t cols, bool mean,
                           cudaStream_t stream) {
  return ColReduceImpl(tuning, d_temp, temp_bytes, d_in, d_out, rows, cols, mean, stream);
}

#define OPSERVE_COL_REDUCE(In, Out)                                                            \
  cudaError_t ColReduce(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out,          \
                        int64_t rows, int64_t cols, bool mean, cudaStream_t stream) {          \
    return ColReduceImpl(kDefaultTuning, d_temp, temp_bytes, row_reduce::DeviceIn(d_in), d_out, \
                         rows, cols, mean, stream);                                            \
  }
OPSERVE_COL_REDUCE(float, float)
OPSERVE_COL_REDUCE(bf16_bits, float)
OPSERVE_COL_REDUCE(int32_t, int64_t)
OPSERVE_COL_REDUCE(int64_t, int64_t)
OPSERVE_COL_REDUCE(int32_t, float)
OPSERVE_COL_REDUCE(int64_t, float)
#undef OPSERVE_COL_REDUCE

}  // namespace opserve::kernels
