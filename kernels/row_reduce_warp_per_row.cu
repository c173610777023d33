// row_sum / row_mean, one warp (or a group of lanes) per row, several rows per block: for short
// rows, where one block per row spends more on launching and synchronizing blocks than on bytes.
//
// Persistent grid (a few blocks per SM); each warp walks its own share of the rows, so no block
// barrier or shared memory is involved, only shuffles. Two shapes of work:
//   - rows of at most kShortMaxCols floats: a group of kGroup lanes per row (kGroup = the power of
//     two >= cols / 4, so one float4 per lane covers the row), 32 / kGroup rows per warp at a
//     time, and kRowsPerLane such rows per lane loaded before any is added. Rows that are 16-byte
//     aligned (cols % 4 == 0 and an aligned base) use float4 loads; others use 4 scalar loads per
//     lane and row. E.g. cols = 64: 16 lanes per row, 2 rows per warp-load of 512 contiguous
//     bytes, 4 loads in flight per lane.
//   - longer rows: the whole warp per row, 16-byte loads kUnroll deep (scalar head and tail up to
//     the first and from the last 16-byte boundary).
// Deterministic: each row's order of additions depends only on cols.
#include <cstdint>

#include "kernels/row_reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace {

using row_reduce::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
// Launch bounds promise 4 blocks (1024 threads) per SM, i.e. <= 64 registers. The persistent grid
// is SMs x the blocks per SM that actually fit (asked of the occupancy calculator, as CUB's
// dispatch does; kMinBlocksPerSm if that fails): rows are dealt out evenly across the grid, so a
// grid larger than what fits would leave a thin second wave.
constexpr int kMinBlocksPerSm = 4;
constexpr int64_t kShortMaxCols = 4 * kWarpSize;  // 128: one float4 per lane of a full warp
constexpr int kRowsPerLane = 4;                   // short path: rows in flight per lane
constexpr int kUnroll = 8;                        // long path: float4 loads in flight per lane
static_assert(kThreads % kWarpSize == 0, "whole warps");
static_assert(kRowsPerLane >= 1 && kUnroll >= 1, "at least one load in flight");

// Short rows (cols <= 4 * kGroup). Warp tile = kRowsPerLane * (32 / kGroup) consecutive rows;
// for each u, the warp's groups take consecutive rows, so a warp-wide load covers contiguous
// memory.
template <int kGroup, bool kAligned>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
row_reduce_group_kernel(const float* __restrict__ d_in, float* __restrict__ d_out, int64_t rows,
                        int64_t cols, float scale) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0,
                "group is a power of two within a warp");
  constexpr int kGroupsPerWarp = kWarpSize / kGroup;
  constexpr int64_t kTileRows = int64_t{kGroupsPerWarp} * kRowsPerLane;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int group = lane / kGroup;
  const int rank = lane % kGroup;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t tiles = CeilDiv(rows, kTileRows);

  // tile is warp-uniform, so every lane reaches the shuffles in GroupSum.
  for (int64_t tile = warp; tile < tiles; tile += num_warps) {
    const int64_t first_row = tile * kTileRows + group;
    float sums[kRowsPerLane];
    if constexpr (kAligned) {
      const int64_t vecs = cols / 4;  // <= kGroup
      float4 v[kRowsPerLane];
#pragma unroll
      for (int u = 0; u < kRowsPerLane; ++u) {
        const int64_t row = first_row + u * kGroupsPerWarp;
        v[u] = row < rows && rank < vecs
                   ? row_reduce::LoadStreaming(reinterpret_cast<const float4*>(d_in + row * cols) +
                                               rank)
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kRowsPerLane; ++u) sums[u] = (v[u].x + v[u].y) + (v[u].z + v[u].w);
    } else {
      float v[kRowsPerLane][4];
#pragma unroll
      for (int u = 0; u < kRowsPerLane; ++u) {
        const int64_t row = first_row + u * kGroupsPerWarp;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int64_t col = rank + k * kGroup;
          v[u][k] = row < rows && col < cols ? row_reduce::LoadStreaming(d_in + row * cols + col)
                                             : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kRowsPerLane; ++u) sums[u] = (v[u][0] + v[u][1]) + (v[u][2] + v[u][3]);
    }
#pragma unroll
    for (int u = 0; u < kRowsPerLane; ++u) {
      const float sum = row_reduce::GroupSum<kGroup>(sums[u]);
      const int64_t row = first_row + u * kGroupsPerWarp;
      if (rank == 0 && row < rows) d_out[row] = sum * scale;
    }
  }
}

// Longer rows: one warp per row.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
row_reduce_warp_kernel(const float* __restrict__ d_in, float* __restrict__ d_out, int64_t rows,
                       int64_t cols, float scale) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp; row < rows; row += num_warps) {  // warp-uniform
    const float partial =
        row_reduce::TeamPartialSum<kWarpSize, kUnroll>(d_in + row * cols, cols, lane);
    const float sum = row_reduce::WarpSum(partial);
    if (lane == 0) d_out[row] = sum * scale;
  }
}

// Grid of a persistent kernel: enough blocks for `blocks_needed`, at most one full wave.
template <typename Kernel>
unsigned PersistentGrid(Kernel kernel, int64_t blocks_needed, int sm_count) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess ||
      per_sm < 1) {
    (void)cudaGetLastError();  // a failed query is not a launch error; use the promised minimum
    per_sm = kMinBlocksPerSm;
  }
  const int64_t wave = int64_t{sm_count > 0 ? sm_count : 1} * per_sm;
  return static_cast<unsigned>(blocks_needed < wave ? blocks_needed : wave);
}

template <int kGroup>
cudaError_t LaunchShort(bool aligned, int sm_count, const float* d_in, float* d_out,
                        int64_t rows, int64_t cols, float scale, cudaStream_t stream) {
  constexpr int64_t kTileRows = int64_t{kWarpSize / kGroup} * kRowsPerLane;
  const int64_t blocks_needed = CeilDiv<int64_t>(CeilDiv(rows, kTileRows), kWarpsPerBlock);
  if (aligned) {
    auto* kernel = row_reduce_group_kernel<kGroup, true>;
    const unsigned grid = PersistentGrid(kernel, blocks_needed, sm_count);
    kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols, scale);
  } else {
    auto* kernel = row_reduce_group_kernel<kGroup, false>;
    const unsigned grid = PersistentGrid(kernel, blocks_needed, sm_count);
    kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols, scale);
  }
  return LastLaunchError();
}

}  // namespace

cudaError_t RowReduceWarpPerRow(void* d_temp, size_t* temp_bytes, const float* d_in,
                                float* d_out, int64_t rows, int64_t cols, bool mean,
                                cudaStream_t stream) {
  if (d_temp == nullptr) {  // size query: no scratch needed
    *temp_bytes = 0;
    return cudaSuccess;
  }
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  int sm_count = 0;
  const cudaError_t err = row_reduce::CurrentSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const float scale = row_reduce::OutputScale(cols, mean);

  if (cols > kShortMaxCols) {
    const unsigned grid = PersistentGrid(row_reduce_warp_kernel,
                                         CeilDiv<int64_t>(rows, kWarpsPerBlock), sm_count);
    row_reduce_warp_kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols, scale);
    return LastLaunchError();
  }

  // Smallest power-of-two group with 4 * group >= cols.
  int group = 1;
  while (4 * int64_t{group} < cols) group *= 2;
  const bool aligned = cols % 4 == 0 && reinterpret_cast<uintptr_t>(d_in) % 16 == 0;
  switch (group) {
    case 1: return LaunchShort<1>(aligned, sm_count, d_in, d_out, rows, cols, scale, stream);
    case 2: return LaunchShort<2>(aligned, sm_count, d_in, d_out, rows, cols, scale, stream);
    case 4: return LaunchShort<4>(aligned, sm_count, d_in, d_out, rows, cols, scale, stream);
    case 8: return LaunchShort<8>(aligned, sm_count, d_in, d_out, rows, cols, scale, stream);
    case 16: return LaunchShort<16>(aligned, sm_count, d_in, d_out, rows, cols, scale, stream);
    default: return LaunchShort<32>(aligned, sm_count, d_in, d_out, rows, cols, scale, stream);
  }
}

}  // namespace opserve::kernels
