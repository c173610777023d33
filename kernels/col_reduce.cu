// Column sums and means (kernels/col_reduce.h), in two kernels:
//   1. ColPartials: the grid is column strips x chunks of rows. A thread owns one 16-byte vector
//      of columns (kLanes of them: 4 floats, 8 bf16, 4 int32, 2 int64) where every row is
//      16-byte aligned, else one column, and walks its chunk's rows kUnroll at a time, all loads
//      issued before any is added, so a warp reads 512 contiguous bytes per row (128 unaligned)
//      and each thread has kUnroll loads in flight. Its sums go to the scratch row of its chunk.
//   2. ColFinish: each column's chunk sums added in chunk order, then RowFinish (the mean's
//      scale, or the exact integer division) as the row launchers apply it.
// Grid sizing: enough chunks that strips x chunks fill every SM kBlocksPerSm times, with at
// least kMinRowsPerChunk rows a chunk, so the scratch stays a small fraction of the input
// (8192^2 floats: 66 chunks, 2 MiB of partials against 256 MiB read).
// Accumulation: float for FLOAT32 and BFLOAT16 (a running sum per column over its chunk's rows,
// then the chunk sums), int64 for the integers (exact, wrapping modulo 2^64 as numpy's does).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/col_reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace {

using row_reduce::AccT;
using row_reduce::kLanes;
using row_reduce::VecT;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;   // __launch_bounds__: <= 64 registers a thread
constexpr int kUnroll = 8;
constexpr int64_t kMinRowsPerChunk = 16;

// One thread's kN columns at row r: a 16-byte vector (kVec) or a single element.
template <typename In, bool kVec>
struct Cols {
  static constexpr int kN = kVec ? kLanes<In> : 1;
  using Load = std::conditional_t<kVec, VecT<In>, In>;
  __device__ __forceinline__ static void Add(const Load& v, AccT<In> (&acc)[kN]) {
    if constexpr (kVec) {
      AccT<In> a[kN];
      row_reduce::VecToAcc<In>(v, a);
#pragma unroll
      for (int e = 0; e < kN; ++e) acc[e] += a[e];
    } else {
      acc[0] += row_reduce::ToAcc(v);
    }
  }
};

template <typename In, bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    col_partials(const In* __restrict__ x, AccT<In>* __restrict__ partial, int64_t rows,
                 int64_t cols, int64_t rows_per_chunk) {
  using C = Cols<In, kVec>;
  using Load = typename C::Load;
  constexpr int kN = C::kN;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t col0 = slot * kN;
  if (col0 >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  // Rows in units of Load: a row is cols / kN of them when vectorized.
  const int64_t stride = cols / kN;
  const Load* p = reinterpret_cast<const Load*>(x) + r0 * stride + slot;
  AccT<In> acc[kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) acc[e] = AccT<In>(0);
  int64_t r = r0;
  for (; r + kUnroll <= r1; r += kUnroll, p += kUnroll * stride) {
    Load v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = row_reduce::LoadStreaming(p + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) C::Add(v[u], acc);
  }
  for (; r < r1; ++r, p += stride) C::Add(row_reduce::LoadStreaming(p), acc);
  AccT<In>* out = partial + static_cast<int64_t>(blockIdx.y) * cols + col0;
#pragma unroll
  for (int e = 0; e < kN; ++e) out[e] = acc[e];
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

template <typename In, typename Out>
cudaError_t ColReduceImpl(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out,
                          int64_t rows, int64_t cols, bool mean, cudaStream_t stream) {
  using Acc = AccT<In>;
  using Finish = row_reduce::RowFinish<Acc, Out>;
  Finish finish{};
  // Each output reduces `rows` elements: the count a mean divides by.
  if (!Finish::Make(rows, mean, &finish)) return cudaErrorInvalidValue;
  const bool vec = cols % kLanes<In> == 0 && reinterpret_cast<uintptr_t>(d_in) % 16 == 0;
  const int64_t slots = vec ? cols / kLanes<In> : cols;
  const int64_t strips = CeilDiv<int64_t>(std::max<int64_t>(slots, 1), kThreads);
  int sm_count = 0;
  if (const cudaError_t err = row_reduce::CurrentSmCount(&sm_count); err != cudaSuccess) return err;
  const int64_t want = CeilDiv<int64_t>(int64_t{sm_count} * kBlocksPerSm, strips);
  const int64_t rows_per_chunk =
      std::max(kMinRowsPerChunk, CeilDiv<int64_t>(std::max<int64_t>(rows, 1), want));
  // gridDim.y is at most 65535: longer matrices take longer chunks.
  const int64_t chunks_wanted = CeilDiv<int64_t>(std::max<int64_t>(rows, 1), rows_per_chunk);
  const int64_t per_chunk =
      chunks_wanted > 65535 ? CeilDiv<int64_t>(rows, 65535) : rows_per_chunk;
  const int64_t chunks = CeilDiv<int64_t>(std::max<int64_t>(rows, 1), per_chunk);
  const size_t need = static_cast<size_t>(chunks) * static_cast<size_t>(std::max<int64_t>(cols, 1)) * sizeof(Acc);
  if (d_temp == nullptr) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) return cudaErrorInvalidValue;
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  auto* partial = static_cast<Acc*>(d_temp);
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(chunks));
  if (vec) {
    col_partials<In, true><<<grid, kThreads, 0, stream>>>(d_in, partial, rows, cols, per_chunk);
  } else {
    col_partials<In, false><<<grid, kThreads, 0, stream>>>(d_in, partial, rows, cols, per_chunk);
  }
  if (const cudaError_t err = LastLaunchError(); err != cudaSuccess) return err;
  col_finish<Acc, Out, Finish><<<static_cast<unsigned>(CeilDiv<int64_t>(cols, kThreads)), kThreads,
                                 0, stream>>>(partial, d_out, cols, chunks, finish);
  return LastLaunchError();
}

}  // namespace

#define OPSERVE_COL_REDUCE(In, Out)                                                            \
  cudaError_t ColReduce(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out,          \
                        int64_t rows, int64_t cols, bool mean, cudaStream_t stream) {          \
    return ColReduceImpl(d_temp, temp_bytes, row_reduce::DeviceIn(d_in), d_out, rows, cols,    \
                         mean, stream);                                                        \
  }
OPSERVE_COL_REDUCE(float, float)
OPSERVE_COL_REDUCE(bf16_bits, float)
OPSERVE_COL_REDUCE(int32_t, int64_t)
OPSERVE_COL_REDUCE(int64_t, int64_t)
OPSERVE_COL_REDUCE(int32_t, float)
OPSERVE_COL_REDUCE(int64_t, float)
#undef OPSERVE_COL_REDUCE

}  // namespace opserve::kernels
