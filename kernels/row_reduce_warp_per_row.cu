// row_sum / row_mean, one warp (or a group of lanes) per row, several rows per block: for short
// rows, where one block per row spends more on launching and synchronizing blocks than on bytes.
//
// Persistent grid (a few blocks per SM); each warp walks its own share of the rows, so no block
// barrier or shared memory is involved, only shuffles. Two shapes of work:
//   - rows of at most kShortMaxCols floats: a group of kGroup lanes per row (kGroup = the power of
//     two >= cols / 4, so one float4 per lane covers the row), 32 / kGroup rows per warp at a
//     time, and kRowsPerLane such rows per lane loaded before any is added; the next tile's loads
//     are issued before the current tile is reduced (software pipelining). Rows that are 16-byte
//     aligned (cols % 4 == 0 and an aligned base) use float4 loads; others use 4 scalar loads per
//     lane and row. E.g. cols = 64: 16 lanes per row, 2 rows per warp-load of 512 contiguous
//     bytes, 4 to 8 16-byte loads in flight per lane.
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
// memory. Each lane holds its kRowsPerLane rows' values as float4 (aligned rows: one 16-byte load;
// others: 4 scalar loads into x, y, z, w).
template <int kGroup>
struct GroupTile {
  float4 v[kRowsPerLane];
};

// Issues the loads of `tile` (rows past the end read nothing and hold zeros). Only issues them:
// nothing here waits for the data, so the caller can reduce another tile while they fly.
template <int kGroup, bool kAligned>
__device__ __forceinline__ void LoadGroupTile(GroupTile<kGroup>& t, const float* __restrict__ d_in,
                                              int64_t rows, int64_t cols, int64_t tile, int group,
                                              int rank) {
  constexpr int kGroupsPerWarp = kWarpSize / kGroup;
  constexpr int64_t kTileRows = int64_t{kGroupsPerWarp} * kRowsPerLane;
  const int64_t first_row = tile * kTileRows + group;
#pragma unroll
  for (int u = 0; u < kRowsPerLane; ++u) {
    const int64_t row = first_row + u * kGroupsPerWarp;
    if constexpr (kAligned) {
      const int64_t vecs = cols / 4;  // <= kGroup
      t.v[u] = row < rows && rank < vecs
                   ? row_reduce::LoadStreaming(reinterpret_cast<const float4*>(d_in + row * cols) +
                                               rank)
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      // cols <= 4 * kGroup <= 128 here, so column arithmetic fits an int.
      const float* p = d_in + (row < rows ? row : 0) * cols + rank;
      const int ncols = static_cast<int>(cols);
      float x[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        x[k] = row < rows && rank + k * kGroup < ncols ? row_reduce::LoadStreaming(p + k * kGroup)
                                                        : 0.0f;
      }
      t.v[u] = make_float4(x[0], x[1], x[2], x[3]);
    }
  }
}

// Adds up each row of `tile` across its group (all lanes must call it: shuffles) and stores it.
template <int kGroup>
__device__ __forceinline__ void ReduceGroupTile(const GroupTile<kGroup>& t,
                                                float* __restrict__ d_out, int64_t rows,
                                                int64_t tile, int group, int rank, float scale) {
  constexpr int kGroupsPerWarp = kWarpSize / kGroup;
  constexpr int64_t kTileRows = int64_t{kGroupsPerWarp} * kRowsPerLane;
  const int64_t first_row = tile * kTileRows + group;
#pragma unroll
  for (int u = 0; u < kRowsPerLane; ++u) {
    const float4& v = t.v[u];
    const float sum = row_reduce::GroupSum<kGroup>((v.x + v.y) + (v.z + v.w));
    const int64_t row = first_row + u * kGroupsPerWarp;
    if (rank == 0 && row < rows) d_out[row] = sum * scale;
  }
}

// Software-pipelined over the warp's tiles: the loads of its next tile are issued before the
// current tile's shuffles and stores, so each lane keeps kRowsPerLane to 2 * kRowsPerLane 16-byte
// loads in flight the whole time instead of kRowsPerLane then none (ncu on the unpipelined
// version, 1048576 x 64, H200: one batch in flight per warp, 86% of DRAM peak, 0.848x the read
// stream). Two named buffers, not `cur = next`: a register copy of a pending load would wait
// for it at the copy.
template <int kGroup, bool kAligned>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
row_reduce_group_kernel(const float* __restrict__ d_in, float* __restrict__ d_out, int64_t rows,
                        int64_t cols, float scale) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0,
                "group is a power of two within a warp");
  constexpr int64_t kTileRows = int64_t{kWarpSize / kGroup} * kRowsPerLane;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int group = lane / kGroup;
  const int rank = lane % kGroup;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t tiles = CeilDiv(rows, kTileRows);

  // tile is warp-uniform, so every lane reaches the shuffles in ReduceGroupTile.
  int64_t tile = warp;
  if (tile >= tiles) return;
  GroupTile<kGroup> a, b;
  LoadGroupTile<kGroup, kAligned>(a, d_in, rows, cols, tile, group, rank);
  while (true) {
    LoadGroupTile<kGroup, kAligned>(b, d_in, rows, cols, tile + num_warps, group, rank);
    ReduceGroupTile<kGroup>(a, d_out, rows, tile, group, rank, scale);
    tile += num_warps;
    if (tile >= tiles) break;
    LoadGroupTile<kGroup, kAligned>(a, d_in, rows, cols, tile + num_warps, group, rank);
    ReduceGroupTile<kGroup>(b, d_out, rows, tile, group, rank, scale);
    tile += num_warps;
    if (tile >= tiles) break;
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

// Grid of a persistent kernel whose warps take `units` warp-sized pieces of work (tiles or rows)
// in a grid stride: at most one full wave, and balanced: with `rounds` = the pieces the busiest
// warp must take, just enough warps that nearly all of them take exactly `rounds`. A full wave
// would leave a thin last round instead (1048576 x 64 on 132 SMs x 4 blocks: 31.03 tiles per
// warp, so a last round of 3% of the warps, ~one tile's latency with the GPU nearly idle).
template <typename Kernel>
unsigned PersistentGrid(Kernel kernel, int64_t units, int sm_count) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess ||
      per_sm < 1) {
    (void)cudaGetLastError();  // a failed query is not a launch error; use the promised minimum
    per_sm = kMinBlocksPerSm;
  }
  const int64_t wave_warps = int64_t{sm_count > 0 ? sm_count : 1} * per_sm * kWarpsPerBlock;
  const int64_t rounds = CeilDiv(units, wave_warps);
  const int64_t warps = CeilDiv(units, rounds);  // <= wave_warps
  return static_cast<unsigned>(CeilDiv<int64_t>(warps, kWarpsPerBlock));
}

template <int kGroup>
cudaError_t LaunchShort(bool aligned, int sm_count, const float* d_in, float* d_out,
                        int64_t rows, int64_t cols, float scale, cudaStream_t stream) {
  constexpr int64_t kTileRows = int64_t{kWarpSize / kGroup} * kRowsPerLane;
  const int64_t tiles = CeilDiv(rows, kTileRows);
  if (aligned) {
    auto* kernel = row_reduce_group_kernel<kGroup, true>;
    const unsigned grid = PersistentGrid(kernel, tiles, sm_count);
    kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols, scale);
  } else {
    auto* kernel = row_reduce_group_kernel<kGroup, false>;
    const unsigned grid = PersistentGrid(kernel, tiles, sm_count);
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
    const unsigned grid = PersistentGrid(row_reduce_warp_kernel, rows, sm_count);
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
