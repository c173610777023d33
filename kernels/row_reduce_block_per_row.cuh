// Row reduction, one block per row (llama.cpp's reduce_rows_f32 and its mean.cu launcher),
// with 16-byte loads, kUnroll independent loads in flight per thread, and one addition for the
// shapes one block per row cannot fill: a few long rows.
//
// Block size, as ggml-cuda's mean.cu / sumrows.cu choose it, with its column thresholds read as
// row bytes (llama.cpp counts 4-byte floats), so that a thread's bytes in flight, what the choice
// is about, do not depend on the element type: a row of 8192 bf16 is treated as a 16 KiB row.
//   rows / sm_count < 2     -> 512 threads (few blocks: make each one wide);
//   otherwise               -> 32 threads if a row is under 4 KiB, else 128 (many blocks: keep
//                              each small);
//   not llama.cpp: many rows of >= 32 KiB -> 512 (kWideMinBytes below).
// Split rows (not in llama.cpp): with fewer rows than the GPU holds blocks and rows of at least
// kSplitMinBytes, each row is cut into `splits` chunks, one 512-thread block each, that write
// partials to d_temp; a second launch combines each row's partials in a fixed order (one warp per
// row). Deterministic: the partition depends only on (rows, cols, element size, SM count).
// Scratch: rows * splits accumulators (the operator's: reduce_op.cuh) when split, else 0.
// Included by the op files' instantiation .cu files (row_sum.cu, row_max.cu...).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/launch_bounds.cuh"
#include "kernels/reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace block_per_row {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using row_reduce::kWarpSize;

// 16-byte loads in flight per thread. 8 covers a 16 KiB row in one round trip with 128 threads
// (CUB's segmented policy: 256 threads x 16 floats) and keeps registers <= 64.
constexpr int kUnroll = 8;
constexpr int64_t kVecBytes = row_reduce::kVecBytes;
// llama.cpp's three block sizes.
constexpr int kWideThreads = 512;    // rows / sm_count < kWideRowsPerSm
constexpr int kNarrowThreads = 32;   // many rows, rows of < kNarrowMaxBytes
constexpr int kMediumThreads = 128;  // many rows, longer rows
constexpr int64_t kNarrowMaxBytes = 1024 * 4;  // llama.cpp's ncols < 1024 (floats)
// Not llama.cpp: many rows of >= 32 KiB also take 512 threads, so such a row is one round of
// 4 loads a thread in one block, not two rounds of a 128-thread block (docs/performance/row_reduce.md).
// Not for 16 KiB rows: 2 loads a thread in 2 resident 512-thread blocks (the 64-register cap) are
// too few bytes in flight.
constexpr int64_t kWideMinBytes = 8192 * 4;
constexpr int64_t kWideRowsPerSm = 2;
// Split only rows this long: below ~256 KiB one 512-thread block needs at most a few round trips
// to memory, which costs about as much as the second launch that a split adds.
constexpr int64_t kSplitMinBytes = 65536 * 4;
// Aim for this many split blocks per SM: 2 resident 512-thread blocks (launch bounds below) times
// 2 waves, so that uneven memory service between blocks evens out.
constexpr int64_t kSplitBlocksPerSm = 4;
// Smallest chunk worth a block: half a kUnroll round of a 512-thread block (4 loads a thread).
constexpr int64_t kMinChunkBytes = int64_t{kWideThreads} * kVecBytes * kUnroll / 2;
constexpr int kFinalizeThreads = 256;
constexpr int64_t kMaxGrid = 0x7fffffff;  // gridDim.x limit; larger counts use the grid stride

static_assert(kUnroll >= 1 && kUnroll <= 16, "unroll bounds registers");
static_assert(kWideThreads % kWarpSize == 0 && kMediumThreads % kWarpSize == 0 &&
                  kNarrowThreads % kWarpSize == 0 && kWideThreads <= 1024,
              "block sizes are whole warps");
static_assert(kMinChunkBytes % kVecBytes == 0 && kSplitMinBytes >= 2 * kMinChunkBytes,
              "a split row has at least two chunks, each a whole number of 16-byte vectors");
static_assert(kFinalizeThreads % kWarpSize == 0, "finalize runs one warp per row");

// Work item w in [0, rows * splits) is chunk (w % splits) of row (w / splits); out[w] gets
// finish(its result). With splits == 1, out is d_out and finish the launcher's RowFinish;
// otherwise out is the partials in d_temp and finish keeps the accumulator.
// Min blocks per SM = 1024 / threads caps registers at 64 for every block size, so 512-thread
// blocks are guaranteed 2 per SM (kSplitBlocksPerSm relies on it). Where an SM holds fewer
// blocks (32-thread blocks on 8.6, 8.9, 12.x) LaunchMinBlocks asks for as many as it holds.
template <typename Op, int kThreads, typename In, typename Out, typename Finish>
__global__ void __launch_bounds__(kThreads, LaunchMinBlocks(kThreads, 1024 / kThreads))
row_reduce_block_kernel(const In* __restrict__ d_in, Out* __restrict__ out, int64_t rows,
                        int64_t cols, int64_t splits, int64_t chunk, Finish finish) {
  using Acc = row_reduce::AccT<Op, In>;
  const int64_t items = rows * splits;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const int64_t row = w / splits;
    const int64_t begin = (w - row * splits) * chunk;
    const int64_t len = cols - begin < chunk ? cols - begin : chunk;
    const Acc partial = row_reduce::TeamPartial<Op, kThreads, kUnroll>(
        d_in + row * cols + begin, len, static_cast<int>(threadIdx.x));
    const Acc total = row_reduce::BlockReduce<Op, kThreads>(partial);
    if (threadIdx.x == 0) out[w] = finish(total);
    // BlockReduce's shared slots are rewritten by the next item: all reads of them must be done.
    __syncthreads();
  }
}

// Second pass of a split: one warp per row combines the row's `splits` partials, lane-strided then
// a fixed butterfly, so the order never changes.
template <typename Op, typename Acc, typename Out, typename Finish>
__global__ void __launch_bounds__(kFinalizeThreads)
row_reduce_block_finalize_kernel(const Acc* __restrict__ partials, Out* __restrict__ d_out,
                                 int64_t rows, int64_t splits, Finish finish) {
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) * kFinalizeThreads + threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  if (row >= rows) return;  // whole warps leave together: row is uniform across a warp
  Acc total = row_reduce::Identity<Op, Acc>();
  for (int64_t k = lane; k < splits; k += kWarpSize) {
    total = row_reduce::Combine<Op>(total, partials[row * splits + k]);
  }
  total = row_reduce::WarpReduce<Op>(total);
  if (lane == 0) d_out[row] = finish(total);
}

struct Plan {
  int threads;     // block size
  int64_t splits;  // chunks per row; 1 = no second pass
  int64_t chunk;   // columns per chunk (the last one may be shorter)
};

Plan MakePlan(int64_t rows, int64_t cols, int64_t elem_bytes, int64_t sm_count) {
  const int64_t row_bytes = cols * elem_bytes;
  const int64_t lanes = kVecBytes / elem_bytes;
  const int64_t split_target = sm_count * kSplitBlocksPerSm;
  if (row_bytes >= kSplitMinBytes && rows < split_target) {
    const int64_t by_occupancy = CeilDiv(split_target, rows);
    const int64_t by_length = CeilDiv(cols, kMinChunkBytes / elem_bytes);
    const int64_t want = by_occupancy < by_length ? by_occupancy : by_length;
    // Chunks a whole number of 16-byte vectors long: every chunk of a row then has the row's
    // alignment phase, so the scalar head and tail stay under one vector a chunk.
    const int64_t chunk = CeilDiv<int64_t>(CeilDiv(cols, want), lanes) * lanes;
    const int64_t splits = CeilDiv(cols, chunk);
    if (splits >= 2) return Plan{kWideThreads, splits, chunk};
  }
  const int threads = rows / sm_count < kWideRowsPerSm || row_bytes >= kWideMinBytes
                          ? kWideThreads
                          : (row_bytes < kNarrowMaxBytes ? kNarrowThreads : kMediumThreads);
  return Plan{threads, 1, cols};
}

template <typename Op, typename In, typename Out, typename Finish>
cudaError_t LaunchBlocks(const Plan& plan, const In* d_in, Out* out, int64_t rows, int64_t cols,
                         Finish finish, cudaStream_t stream) {
  const int64_t items = rows * plan.splits;
  const unsigned grid = static_cast<unsigned>(items < kMaxGrid ? items : kMaxGrid);
  switch (plan.threads) {
    case kWideThreads:
      row_reduce_block_kernel<Op, kWideThreads><<<grid, kWideThreads, 0, stream>>>(
          d_in, out, rows, cols, plan.splits, plan.chunk, finish);
      break;
    case kMediumThreads:
      row_reduce_block_kernel<Op, kMediumThreads><<<grid, kMediumThreads, 0, stream>>>(
          d_in, out, rows, cols, plan.splits, plan.chunk, finish);
      break;
    default:
      row_reduce_block_kernel<Op, kNarrowThreads><<<grid, kNarrowThreads, 0, stream>>>(
          d_in, out, rows, cols, plan.splits, plan.chunk, finish);
      break;
  }
  return LastLaunchError();
}

template <typename Op, typename In, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  using Acc = row_reduce::AccT<Op, In>;
  const auto finish = row_reduce::RowFinish<Op, Out>::Make(cols);
  if (rows <= 0 || cols <= 0) {
    if (d_temp == nullptr) *temp_bytes = 0;
    return cudaSuccess;
  }
  int sm_count = 0;
  cudaError_t err = row_reduce::CurrentSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  if (sm_count < 1) sm_count = 1;
  const Plan plan = MakePlan(rows, cols, sizeof(In), sm_count);
  const size_t needed =
      plan.splits > 1 ? static_cast<size_t>(rows * plan.splits) * sizeof(Acc) : 0;
  if (d_temp == nullptr) {  // size query
    *temp_bytes = needed;
    return cudaSuccess;
  }
  if (*temp_bytes < needed) return cudaErrorInvalidValue;  // would write past the scratch

  if (plan.splits == 1) return LaunchBlocks<Op>(plan, d_in, d_out, rows, cols, finish, stream);

  Acc* d_partials = static_cast<Acc*>(d_temp);
  err = LaunchBlocks<Op>(plan, d_in, d_partials, rows, cols, row_reduce::Keep{}, stream);
  if (err != cudaSuccess) return err;
  constexpr int kRowsPerFinalizeBlock = kFinalizeThreads / kWarpSize;
  const unsigned grid = static_cast<unsigned>(CeilDiv<int64_t>(rows, kRowsPerFinalizeBlock));
  row_reduce_block_finalize_kernel<Op><<<grid, kFinalizeThreads, 0, stream>>>(
      d_partials, d_out, rows, plan.splits, finish);
  return LastLaunchError();
}

}  // namespace
}  // namespace block_per_row

OPSERVE_DEFINE_ROW_REDUCE_ALL(RowReduceBlockPerRow, block_per_row::Impl)

}  // namespace opserve::kernels
