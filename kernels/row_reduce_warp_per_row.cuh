// Row reduction, one warp (or a group of lanes) per row, several rows per block: for short
// rows, where one block per row spends more on launching and synchronizing blocks than on bytes.
//
// Persistent grid (a few blocks per SM); each warp walks its own share of the rows, so no block
// barrier or shared memory is involved, only shuffles. Two shapes of work:
//   - rows of at most 512 bytes (kShortMaxCols: 128 floats or int32, 256 bf16, 64 int64): a group
//     of kGroup lanes per row (kGroup = the power of two >= the row's 16-byte vectors, so one
//     16-byte vector per lane covers the row), 32 / kGroup rows per warp at a time, and
//     kRowsPerLane such rows per lane loaded before any is added; the next tile's loads are
//     issued before the current tile is reduced (software pipelining). Rows that are 16-byte
//     aligned (cols a whole number of vectors and an aligned base) use 16-byte loads; others use
//     one scalar load per element (a vector's worth per lane and row). E.g. 64 floats: 16 lanes
//     per row, 2 rows per warp-load of 512 contiguous bytes, 4 to 8 16-byte loads in flight per
//     lane.
//   - longer rows: the whole warp per row, 16-byte loads kUnroll deep (scalar head and tail up to
//     the first and from the last 16-byte boundary).
// Accumulation in the operator's accumulator (reduce_op.cuh); lanes past a row's end hold its
// identity. Deterministic: each row's order of combines depends only on cols.
// Included by the op files' instantiation .cu files (row_sum.cu, row_max.cu...).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/reduce.h"
#include "kernels/row_reduce_common.cuh"

namespace opserve::kernels {
namespace warp_per_row {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using row_reduce::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
// Launch bounds promise 4 blocks (1024 threads) per SM, i.e. <= 64 registers. The persistent grid
// is SMs x the blocks per SM that actually fit (asked of the occupancy calculator, as CUB's
// dispatch does; kMinBlocksPerSm if that fails): rows are dealt out evenly across the grid, so a
// grid larger than what fits would leave a thin second wave.
constexpr int kMinBlocksPerSm = 4;
constexpr int kUnroll = 8;  // long path: 16-byte loads in flight per lane
static_assert(kThreads % kWarpSize == 0, "whole warps");
static_assert(kUnroll >= 1, "at least one load in flight");

// Short path: rows of at most one 16-byte vector per lane of a warp.
template <typename In>
inline constexpr int64_t kShortMaxCols = int64_t{kWarpSize} * row_reduce::kLanes<In>;

// Short path, rows in flight per lane: 4, each one 16-byte vector (4 registers) when aligned, or
// its kLanes elements when not (4 registers for float / int32 / int64: a register a 4-byte
// element, two an 8-byte one). Unaligned bf16 would take 8 registers a row, a register per
// element, so it keeps 2 rows, which holds a tile to the same 16 registers (two tiles are live
// while the pipeline runs, under the 64-register cap).
template <typename In, bool kAligned>
inline constexpr int kRowsPerLane = (!kAligned && sizeof(In) < 4) ? 2 : 4;

// Short rows (cols <= kLanes * kGroup). Warp tile = kRowsPerLane * (32 / kGroup) consecutive rows;
// for each u, the warp's groups take consecutive rows, so a warp-wide load covers contiguous
// memory. Each lane holds, per row, one 16-byte vector (aligned rows) or kLanes scalars at
// columns rank, rank + kGroup, ... (others).
template <typename In, bool kAligned>
struct GroupTile;
template <typename In>
struct GroupTile<In, true> {
  row_reduce::VecT<In> v[kRowsPerLane<In, true>];
};
template <typename In>
struct GroupTile<In, false> {
  In x[kRowsPerLane<In, false>][row_reduce::kLanes<In>];
};

// Issues the loads of `tile` (rows and columns past the end read nothing and hold the operator's
// identity). Only issues them: nothing here waits for the data, so the caller can reduce another
// tile while they fly.
template <typename Op, int kGroup, typename In, bool kAligned>
__device__ __forceinline__ void LoadGroupTile(GroupTile<In, kAligned>& t,
                                              const In* __restrict__ d_in, int64_t rows,
                                              int64_t cols, int64_t tile, int group, int rank) {
  constexpr int kL = row_reduce::kLanes<In>;
  constexpr int kRows = kRowsPerLane<In, kAligned>;
  constexpr int kGroupsPerWarp = kWarpSize / kGroup;
  constexpr int64_t kTileRows = int64_t{kGroupsPerWarp} * kRows;
  const int64_t first_row = tile * kTileRows + group;
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    const int64_t row = first_row + u * kGroupsPerWarp;
    if constexpr (kAligned) {
      const int64_t vecs = cols / kL;  // <= kGroup
      t.v[u] = row < rows && rank < vecs
                   ? row_reduce::LoadStreaming(
                         reinterpret_cast<const row_reduce::VecT<In>*>(d_in + row * cols) + rank)
                   : row_reduce::PadVec<Op, In>();
    } else {
      // cols <= kShortMaxCols here, so column arithmetic fits an int.
      const In* p = d_in + (row < rows ? row : 0) * cols + rank;
      const int ncols = static_cast<int>(cols);
#pragma unroll
      for (int k = 0; k < kL; ++k) {
        t.x[u][k] = row < rows && rank + k * kGroup < ncols
                        ? row_reduce::LoadStreaming(p + k * kGroup)
                        : row_reduce::PadElem<Op, In>();
      }
    }
  }
}

// Reduces each row of `tile` across its group (all lanes must call it: shuffles) and stores
// finish(result).
template <typename Op, int kGroup, typename In, bool kAligned, typename Out, typename Finish>
__device__ __forceinline__ void ReduceGroupTile(const GroupTile<In, kAligned>& t,
                                                Out* __restrict__ d_out, int64_t rows,
                                                int64_t tile, int group, int rank,
                                                const Finish& finish) {
  using Acc = row_reduce::AccT<Op, In>;
  constexpr int kL = row_reduce::kLanes<In>;
  constexpr int kRows = kRowsPerLane<In, kAligned>;
  constexpr int kGroupsPerWarp = kWarpSize / kGroup;
  constexpr int64_t kTileRows = int64_t{kGroupsPerWarp} * kRows;
  const int64_t first_row = tile * kTileRows + group;
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    Acc a[kL];
    if constexpr (kAligned) {
      row_reduce::VecToAcc<Op, In>(t.v[u], a);
    } else {
#pragma unroll
      for (int k = 0; k < kL; ++k) a[k] = reduce::ToAcc<Op>(t.x[u][k]);
    }
    const Acc total = row_reduce::GroupReduce<Op, kGroup>(row_reduce::Tree<Op>(a));
    const int64_t row = first_row + u * kGroupsPerWarp;
    if (rank == 0 && row < rows) d_out[row] = finish(total);
  }
}

// Software-pipelined over the warp's tiles: the loads of its next tile are issued before the
// current tile's shuffles and stores, so each lane keeps kRowsPerLane to 2 * kRowsPerLane rows'
// loads in flight the whole time instead of kRowsPerLane then none. Two named buffers, not
// `cur = next`: a register copy of a pending load would wait for it at the copy.
template <typename Op, int kGroup, typename In, bool kAligned, typename Out, typename Finish>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
row_reduce_group_kernel(const In* __restrict__ d_in, Out* __restrict__ d_out, int64_t rows,
                        int64_t cols, Finish finish) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0,
                "group is a power of two within a warp");
  constexpr int64_t kTileRows = int64_t{kWarpSize / kGroup} * kRowsPerLane<In, kAligned>;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int group = lane / kGroup;
  const int rank = lane % kGroup;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t tiles = CeilDiv(rows, kTileRows);

  // tile is warp-uniform, so every lane reaches the shuffles in ReduceGroupTile.
  int64_t tile = warp;
  if (tile >= tiles) return;
  GroupTile<In, kAligned> a, b;
  LoadGroupTile<Op, kGroup>(a, d_in, rows, cols, tile, group, rank);
  while (true) {
    LoadGroupTile<Op, kGroup>(b, d_in, rows, cols, tile + num_warps, group, rank);
    ReduceGroupTile<Op, kGroup>(a, d_out, rows, tile, group, rank, finish);
    tile += num_warps;
    if (tile >= tiles) break;
    LoadGroupTile<Op, kGroup>(a, d_in, rows, cols, tile + num_warps, group, rank);
    ReduceGroupTile<Op, kGroup>(b, d_out, rows, tile, group, rank, finish);
    tile += num_warps;
    if (tile >= tiles) break;
  }
}

// Longer rows: one warp per row.
template <typename Op, typename In, typename Out, typename Finish>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
row_reduce_warp_kernel(const In* __restrict__ d_in, Out* __restrict__ d_out, int64_t rows,
                       int64_t cols, Finish finish) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp; row < rows; row += num_warps) {  // warp-uniform
    const auto partial =
        row_reduce::TeamPartial<Op, kWarpSize, kUnroll>(d_in + row * cols, cols, lane);
    const auto total = row_reduce::WarpReduce<Op>(partial);
    if (lane == 0) d_out[row] = finish(total);
  }
}

// Grid of a persistent kernel whose warps take `units` warp-sized pieces of work (tiles or rows)
// in a grid stride: at most one full wave, and balanced: with `rounds` = the pieces the busiest
// warp must take, just enough warps that nearly all of them take exactly `rounds`. A full wave
// would leave a thin last round instead (1048576 x 64 floats on 132 SMs x 4 blocks: 31.03 tiles
// per warp, so a last round of 3% of the warps, ~one tile's latency with the GPU nearly idle).
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

template <typename Op, int kGroup, bool kAligned, typename In, typename Out, typename Finish>
cudaError_t LaunchShortAs(int sm_count, const In* d_in, Out* d_out, int64_t rows, int64_t cols,
                          Finish finish, cudaStream_t stream) {
  constexpr int64_t kTileRows = int64_t{kWarpSize / kGroup} * kRowsPerLane<In, kAligned>;
  auto* kernel = row_reduce_group_kernel<Op, kGroup, In, kAligned, Out, Finish>;
  const unsigned grid = PersistentGrid(kernel, CeilDiv(rows, kTileRows), sm_count);
  kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols, finish);
  return LastLaunchError();
}

template <typename Op, int kGroup, typename In, typename Out, typename Finish>
cudaError_t LaunchShort(bool aligned, int sm_count, const In* d_in, Out* d_out, int64_t rows,
                        int64_t cols, Finish finish, cudaStream_t stream) {
  return aligned
             ? LaunchShortAs<Op, kGroup, true>(sm_count, d_in, d_out, rows, cols, finish, stream)
             : LaunchShortAs<Op, kGroup, false>(sm_count, d_in, d_out, rows, cols, finish, stream);
}

template <typename Op, typename In, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const In* d_in, Out* d_out, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  using Finish = row_reduce::RowFinish<Op, Out>;
  constexpr int kL = row_reduce::kLanes<In>;
  const Finish finish = Finish::Make(cols);
  if (d_temp == nullptr) {  // size query: no scratch needed
    *temp_bytes = 0;
    return cudaSuccess;
  }
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  int sm_count = 0;
  const cudaError_t err = row_reduce::CurrentSmCount(&sm_count);
  if (err != cudaSuccess) return err;

  if (cols > kShortMaxCols<In>) {
    auto* kernel = row_reduce_warp_kernel<Op, In, Out, Finish>;
    const unsigned grid = PersistentGrid(kernel, rows, sm_count);
    kernel<<<grid, kThreads, 0, stream>>>(d_in, d_out, rows, cols, finish);
    return LastLaunchError();
  }

  // Smallest power-of-two group with kL * group >= cols.
  int group = 1;
  while (kL * int64_t{group} < cols) group *= 2;
  const bool aligned = cols % kL == 0 && reinterpret_cast<uintptr_t>(d_in) % 16 == 0;
  switch (group) {
    case 1: return LaunchShort<Op, 1>(aligned, sm_count, d_in, d_out, rows, cols, finish, stream);
    case 2: return LaunchShort<Op, 2>(aligned, sm_count, d_in, d_out, rows, cols, finish, stream);
    case 4: return LaunchShort<Op, 4>(aligned, sm_count, d_in, d_out, rows, cols, finish, stream);
    case 8: return LaunchShort<Op, 8>(aligned, sm_count, d_in, d_out, rows, cols, finish, stream);
    case 16: return LaunchShort<Op, 16>(aligned, sm_count, d_in, d_out, rows, cols, finish, stream);
    default: return LaunchShort<Op, 32>(aligned, sm_count, d_in, d_out, rows, cols, finish, stream);
  }
}

}  // namespace
}  // namespace warp_per_row

OPSERVE_DEFINE_ROW_REDUCE_ALL(RowReduceWarpPerRow, warp_per_row::Impl)

}  // namespace opserve::kernels
