// row_sum / row_mean, one block per row (llama.cpp's reduce_rows_f32 and its mean.cu launcher),
// with 16-byte loads, kUnroll independent loads in flight per thread, and one addition for the
// shapes one block per row cannot fill: a few long rows.
//
// Block size, exactly as ggml-cuda's mean.cu / sumrows.cu choose it:
//   rows / sm_count < 2  -> 512 threads (few blocks: make each one wide);
//   otherwise            -> 32 threads if cols < 1024, else 128 (many blocks: keep each small);
//   not llama.cpp: many rows of >= 8192 floats -> 512 (kWideMinCols below).
// Split rows (not in llama.cpp): with fewer rows than the GPU holds blocks and rows of at least
// kSplitMinCols, each row is cut into `splits` chunks, one 512-thread block each, that write
// partial sums to d_temp; a second launch adds each row's partials in a fixed order (one warp per
// row). Deterministic: the partition depends only on (rows, cols, SM count).
// Scratch: rows * splits floats when split, else 0 bytes.
#include <cstdint>

#include "kernels/row_reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace {

using row_reduce::kWarpSize;

// 16-byte loads in flight per thread. 8 covers a 4096-float row in one round trip with 128
// threads (CUB's segmented policy: 256 threads x 16 items) and keeps registers <= 64.
constexpr int kUnroll = 8;
// llama.cpp's three block sizes.
constexpr int kWideThreads = 512;    // rows / sm_count < kWideRowsPerSm
constexpr int kNarrowThreads = 32;   // many rows, cols < kNarrowMaxCols
constexpr int kMediumThreads = 128;  // many rows, longer rows
constexpr int64_t kNarrowMaxCols = 1024;
// Not llama.cpp: many rows of >= 8192 floats also take 512 threads, so a 32 KiB row is one round
// of 4 loads a thread in one block, not two rounds of a 128-thread block (opserve-bench, H100,
// 2026-11-23: 8192^2 88.0 us against CUB's 88.7-88.9; 128 x 8 took 89.1-90.1). Not for 4096
// floats: 2 loads a thread in 2 resident 512-thread blocks (the 64-register cap) are too few
// bytes in flight, 33.7 us at 4096^2 against 25.4 (PERFORMANCE.md).
constexpr int64_t kWideMinCols = 8192;
constexpr int64_t kWideRowsPerSm = 2;
// Split only rows this long: below ~64K floats (256 KB) one 512-thread block needs at most a few
// round trips to memory, which costs about as much as the second launch that a split adds.
constexpr int64_t kSplitMinCols = 65536;
// Aim for this many split blocks per SM: 2 resident 512-thread blocks (launch bounds below) times
// 2 waves, so that uneven memory service between blocks evens out.
constexpr int64_t kSplitBlocksPerSm = 4;
// Smallest chunk worth a block: half a kUnroll round of a 512-thread block (4 loads a thread).
constexpr int64_t kMinChunkCols = int64_t{kWideThreads} * 4 * kUnroll / 2;
constexpr int kFinalizeThreads = 256;
constexpr int64_t kMaxGrid = 0x7fffffff;  // gridDim.x limit; larger counts use the grid stride

static_assert(kUnroll >= 1 && kUnroll <= 16, "unroll bounds registers");
static_assert(kWideThreads % kWarpSize == 0 && kMediumThreads % kWarpSize == 0 &&
                  kNarrowThreads % kWarpSize == 0 && kWideThreads <= 1024,
              "block sizes are whole warps");
static_assert(kMinChunkCols % 4 == 0 && kSplitMinCols >= 2 * kMinChunkCols,
              "a split row has at least two chunks, each a whole number of float4s");
static_assert(kFinalizeThreads % kWarpSize == 0, "finalize runs one warp per row");

// Work item w in [0, rows * splits) is chunk (w % splits) of row (w / splits); out[w] gets its
// sum times `scale`. With splits == 1, out is d_out; otherwise the partials in d_temp (scale 1).
// Min blocks per SM = 1024 / threads caps registers at 64 for every block size, so 512-thread
// blocks are guaranteed 2 per SM (kSplitBlocksPerSm relies on it).
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
row_reduce_block_kernel(const float* __restrict__ d_in, float* __restrict__ out, int64_t rows,
                        int64_t cols, int64_t splits, int64_t chunk, float scale) {
  const int64_t items = rows * splits;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const int64_t row = w / splits;
    const int64_t begin = (w - row * splits) * chunk;
    const int64_t len = cols - begin < chunk ? cols - begin : chunk;
    const float partial = row_reduce::TeamPartialSum<kThreads, kUnroll>(
        d_in + row * cols + begin, len, static_cast<int>(threadIdx.x));
    const float total = row_reduce::BlockSum<kThreads>(partial);
    if (threadIdx.x == 0) out[w] = total * scale;
    // BlockSum's shared slots are rewritten by the next item: all reads of them must be done.
    __syncthreads();
  }
}

// Second pass of a split: one warp per row adds the row's `splits` partials, lane-strided then a
// fixed butterfly, so the order never changes.
__global__ void __launch_bounds__(kFinalizeThreads)
row_reduce_block_finalize_kernel(const float* __restrict__ partials, float* __restrict__ d_out,
                                 int64_t rows, int64_t splits, float scale) {
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) * kFinalizeThreads + threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  if (row >= rows) return;  // whole warps leave together: row is uniform across a warp
  float sum = 0.0f;
  for (int64_t k = lane; k < splits; k += kWarpSize) sum += partials[row * splits + k];
  sum = row_reduce::WarpSum(sum);
  if (lane == 0) d_out[row] = sum * scale;
}

struct Plan {
  int threads;     // block size
  int64_t splits;  // chunks per row; 1 = no second pass
  int64_t chunk;   // columns per chunk (the last one may be shorter)
};

Plan MakePlan(int64_t rows, int64_t cols, int64_t sm_count) {
  const int64_t split_target = sm_count * kSplitBlocksPerSm;
  if (cols >= kSplitMinCols && rows < split_target) {
    const int64_t by_occupancy = CeilDiv(split_target, rows);
    const int64_t by_length = CeilDiv(cols, kMinChunkCols);
    const int64_t want = by_occupancy < by_length ? by_occupancy : by_length;
    // Chunks a multiple of 4 floats long: every chunk of a row then has the row's alignment
    // phase, so the scalar head and tail stay under 4 elements a chunk.
    const int64_t chunk = CeilDiv<int64_t>(CeilDiv(cols, want), 4) * 4;
    const int64_t splits = CeilDiv(cols, chunk);
    if (splits >= 2) return Plan{kWideThreads, splits, chunk};
  }
  const int threads = rows / sm_count < kWideRowsPerSm || cols >= kWideMinCols
                          ? kWideThreads
                          : (cols < kNarrowMaxCols ? kNarrowThreads : kMediumThreads);
  return Plan{threads, 1, cols};
}

cudaError_t LaunchBlocks(const Plan& plan, const float* d_in, float* out, int64_t rows,
                         int64_t cols, float scale, cudaStream_t stream) {
  const int64_t items = rows * plan.splits;
  const unsigned grid = static_cast<unsigned>(items < kMaxGrid ? items : kMaxGrid);
  switch (plan.threads) {
    case kWideThreads:
      row_reduce_block_kernel<kWideThreads><<<grid, kWideThreads, 0, stream>>>(
          d_in, out, rows, cols, plan.splits, plan.chunk, scale);
      break;
    case kMediumThreads:
      row_reduce_block_kernel<kMediumThreads><<<grid, kMediumThreads, 0, stream>>>(
          d_in, out, rows, cols, plan.splits, plan.chunk, scale);
      break;
    default:
      row_reduce_block_kernel<kNarrowThreads><<<grid, kNarrowThreads, 0, stream>>>(
          d_in, out, rows, cols, plan.splits, plan.chunk, scale);
      break;
  }
  return LastLaunchError();
}

}  // namespace

cudaError_t RowReduceBlockPerRow(void* d_temp, size_t* temp_bytes, const float* d_in,
                                 float* d_out, int64_t rows, int64_t cols, bool mean,
                                 cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) {
    if (d_temp == nullptr) *temp_bytes = 0;
    return cudaSuccess;
  }
  int sm_count = 0;
  cudaError_t err = row_reduce::CurrentSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  if (sm_count < 1) sm_count = 1;
  const Plan plan = MakePlan(rows, cols, sm_count);
  const size_t needed =
      plan.splits > 1 ? static_cast<size_t>(rows * plan.splits) * sizeof(float) : 0;
  if (d_temp == nullptr) {  // size query
    *temp_bytes = needed;
    return cudaSuccess;
  }
  if (*temp_bytes < needed) return cudaErrorInvalidValue;  // would write past the scratch

  const float scale = row_reduce::OutputScale(cols, mean);
  if (plan.splits == 1) return LaunchBlocks(plan, d_in, d_out, rows, cols, scale, stream);

  float* d_partials = static_cast<float*>(d_temp);
  err = LaunchBlocks(plan, d_in, d_partials, rows, cols, /*scale=*/1.0f, stream);
  if (err != cudaSuccess) return err;
  constexpr int kRowsPerFinalizeBlock = kFinalizeThreads / kWarpSize;
  const unsigned grid = static_cast<unsigned>(CeilDiv<int64_t>(rows, kRowsPerFinalizeBlock));
  row_reduce_block_finalize_kernel<<<grid, kFinalizeThreads, 0, stream>>>(d_partials, d_out, rows,
                                                                          plan.splits, scale);
  return LastLaunchError();
}

}  // namespace opserve::kernels
