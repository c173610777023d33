// transpose, TMA (sm_90): a warp-specialised kernel, run either as a persistent pipeline
// (several stages per CTA, a grid of one wave; the bf16 default) or, the 4-byte default, as one
// single-stage CTA per tile with a grid of every tile, tiles walked column-major
// (one_tile_per_cta; docs/performance/transpose.md says why).
// The description below is of the persistent form; the one-tile form runs the same producer and
// consumers over exactly one tile.
//
//   producer warp (one lane): for each tile, wait until its shared-memory stage is free, then
//     cp.async.bulk.tensor the tile (kBoxes boxes of kRows rows x 128 bytes, 128-byte swizzle)
//     into the stage, completing on the stage's "full" mbarrier. kStages tiles are in flight.
//   4 consumer warps: wait on "full", each thread reads 16-byte vectors (ld.shared.v4) of
//     kVec consecutive rows (a kVec x kVec register block), releases the stage on its "empty"
//     mbarrier, transposes the block in registers (free for fp32: it is register renaming; 32
//     byte permutes per 8x8 block for bf16) and writes kVec 16-byte vectors (st.global.v4) to
//     kVec output rows. One warp store instruction covers whole 128-byte lines (fp32) or
//     64-byte half lines (bf16).
//
// The design bets:
//   - 16-byte accesses on both sides (SASS: LDS.128 and STG.E.128, UTMALDG.2D for the loads): 4x
//     fewer load/store instructions than the classic kernel, and every warp store writes full
//     lines.
//   - bytes in flight: per SM up to max_ctas_per_sm * kStages * 16 KiB of loads are outstanding
//     (128 KiB), far past what Little's law asks (about 3-4 TB/s * ~1 us / 132 SMs = 25-30 KiB).
//   - DRAM locality: tiles are handed out in groups of group_tile_rows tile rows (the GROUP_M
//     rasterisation of matmul kernels), so the tiles in flight form a patch instead of whole tile
//     rows.
//
// Tile shape, raster group, L2 promotion and CTAs per SM are knobs (kernels/transpose_tma_tuning.h);
// TransposeTma runs kDefaultTuning below (the sweep's best at the target shapes) for 4-byte
// elements and kDefaultTuningBf16, the one bf16 build, for 2-byte elements.
//
// Ragged edges: TMA zero-fills the out-of-bounds part of a box; consumers skip stores outside the
// matrix. A box that lies wholly outside is not requested at all.
//
// Shapes (TransposeTmaSupports):
//   - cols * elem_bytes % 16 != 0, rows or cols >= 2^31, 8-byte elements: TMA cannot describe the
//     input (or this file has no consumer for it), and the launcher refuses the call; the server
//     runs smem_tiled for such shapes instead and reports that it did (server/ops/transpose.cc).
//   - rows * elem_bytes % 16 != 0 or d_out not 16-byte aligned: the input still goes through TMA,
//     but output rows are not 16-byte aligned, so each element is stored on its own.
#include <cuda.h>  // CUtensorMap and its enums: types only, libcuda is never linked
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/sm90/arch.h"
#include "kernels/sm90/mbarrier.cuh"
#include "kernels/sm90/tensor_map.h"
#include "kernels/sm90/tma.cuh"
#include "kernels/transpose.h"
#include "kernels/transpose_common.cuh"
#include "kernels/transpose_tma_tuning.h"

namespace opserve::kernels {
namespace {

constexpr int kSwizzleBytes = 128;  // TMA 128-byte swizzle: the box's inner extent is 128 bytes
constexpr int kConsumerWarps = 4;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;  // + one producer warp
constexpr int kSmemAlign = 1024;  // the 128-byte swizzle pattern repeats every 1024 bytes

// A tile is kRows input rows x kBoxes boxes of 128 bytes side by side (64 x 2: 64x64 fp32,
// 64x128 bf16). kStages tiles are in flight per CTA.
// kStagesT = 1: one tile per CTA (TransposeTmaTuning::one_tile_per_cta), the grid as many CTAs
// as tiles; the single stage is filled once, so several CTAs fit an SM.
template <int kRowsT, int kBoxesT, int kStagesT = 0, int kMinCtasT = 1>
struct TileConfig {
  static constexpr int kMinCtas = kMinCtasT;  // __launch_bounds__'s minimum CTAs per SM
  static constexpr int kRows = kRowsT;
  static constexpr int kBoxes = kBoxesT;
  static constexpr int kBoxBytes = kRows * kSwizzleBytes;
  static constexpr int kTileBytes = kBoxes * kBoxBytes;
  // 4 stages of 16 KiB (64 KiB: up to 3 CTAs per SM), 3 of 32 KiB (2 CTAs) or 64 KiB (1 CTA).
  static constexpr int kStages = kStagesT > 0 ? kStagesT : (kTileBytes <= 16 * 1024 ? 4 : 3);
  static constexpr int kSmemBytes = kStages * kTileBytes + 2 * kStages * 8 + kSmemAlign;
  static_assert(kBoxBytes % kSmemAlign == 0,
                "every box must start 1024-byte aligned: the swizzle is a function of address bits 7-9");
  static_assert(kRows % 32 == 0 && kRows <= 256, "consumers take 32-row slices; TMA boxes <= 256 rows");
  static_assert(kStages >= 2 || kStagesT == 1, "double buffering, or one tile per CTA");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA must fit an SM's shared memory");
};
using Tile64x2 = TileConfig<64, 2>;
using Tile64x4 = TileConfig<64, 4>;
using Tile128x2 = TileConfig<128, 2>;
using Tile128x4 = TileConfig<128, 4>;
using Tile64x2Single = TileConfig<64, 2, 1>;
using Tile64x4Single = TileConfig<64, 4, 1>;
using Tile128x4Single = TileConfig<128, 4, 1>;
using Tile32x2Single = TileConfig<32, 2, 1>;
using Tile32x4Single = TileConfig<32, 4, 1>;
// With registers capped for 4 CTAs per SM (<= 102 per thread at 160 threads).
using Tile64x2Single4 = TileConfig<64, 2, 1, 4>;
using Tile32x4Single4 = TileConfig<32, 4, 1, 4>;
// Taller tiles: each output row gets 512 / 1024 contiguous bytes per CTA instead of 256.
using Tile128x2Single = TileConfig<128, 2, 1>;
using Tile256x2Single = TileConfig<256, 2, 1>;

// What TransposeTma runs. 4-byte elements: the fastest setting the sweeps found at the target
// shapes (docs/performance/transpose.md): one tile per CTA, 64 x 2 tiles walked column-major (group = the
// whole tile column), 256-byte promotion. CTAs that each finish one tile, dispatched in tile
// order, keep neighbouring CTAs' DRAM traffic adjacent: they write neighbouring 256-byte pieces
// of the same 64 output rows and read 64-row blocks one under the other.
// 2-byte elements: the persistent 64 x 2 tile, the only bf16 build (the sweeps time 4-byte
// elements only).
constexpr TransposeTmaTuning kDefaultTuning{/*tile_rows=*/64, /*boxes=*/2, /*group_tile_rows=*/0,
                                            /*l2_promote_256=*/true, /*max_ctas_per_sm=*/1,
                                            /*one_tile_per_cta=*/true};
constexpr TransposeTmaTuning kDefaultTuningBf16{/*tile_rows=*/64, /*boxes=*/2,
                                                /*group_tile_rows=*/32, /*l2_promote_256=*/false,
                                                /*max_ctas_per_sm=*/2,
                                                /*one_tile_per_cta=*/false};

// Per element type: the box width and the tensor map's type; for the consumers (kVecOf below),
// kVec elements per 16-byte vector, and a thread moves kVec x kVec register blocks.
//   fp32: a warp block is 32 rows x 16 cols (8 row groups x 4 column chunks); the consumer warps
//         share a tile's (kRows / 32) x (2 * kBoxes) warp blocks evenly.
//   bf16: a warp block is 32 rows x 64 cols (4 row groups x 8 column chunks = one box wide); only
//         the 64 x 2 tile is built, where each consumer warp takes one.
template <typename T>
struct TileShape;
template <>
struct TileShape<uint32_t> {
  static constexpr int kBoxCols = kSwizzleBytes / 4;  // 32
  static constexpr CUtensorMapDataType kDataType = CU_TENSOR_MAP_DATA_TYPE_UINT32;
};
template <>
struct TileShape<uint16_t> {
  static constexpr int kBoxCols = kSwizzleBytes / 2;  // 64
  static constexpr CUtensorMapDataType kDataType = CU_TENSOR_MAP_DATA_TYPE_UINT16;
};

// Device code from here to the kernel exists only in passes with TMA (kernels/sm90/arch.h).
#if defined(OPSERVE_SM90_ENABLED)

template <typename T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector

// ---- PTX wrappers used by this kernel alone (the shared ones are in kernels/sm90/) ----

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// One 16-byte global store. Written out because nvcc 13.0 split some `*(uint4*)p = ...` stores of
// this file into four 4-byte stores (seen in the PTX), which quadruples the store instructions.
// A plain store, not evict-first (st.global.cs), which is no faster here (docs/performance/transpose.md).
__device__ __forceinline__ void StoreGlobal16(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// Byte offset of 16-byte chunk `chunk` of box row `row` under the 128-byte swizzle: the chunk index
// (address bits 4-6) is XORed with the row index mod 8 (address bits 7-9), box base 1024-aligned.
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return static_cast<uint32_t>(row * kSwizzleBytes + ((chunk ^ (row & 7)) << 4));
}

// Tile index -> (tile row, tile column). Consecutive indices walk down a group of `group_rows`
// tile rows before moving one tile column right, so the tiles in flight at any moment (a window of
// consecutive indices, as persistent CTAs advance in step) form a patch instead of whole tile rows.
__device__ __forceinline__ void TileCoords(uint32_t tile, uint32_t tiles_x, uint32_t tiles_y,
                                           uint32_t group_rows, uint32_t* ty, uint32_t* tx) {
  const uint32_t group_tiles = group_rows * tiles_x;
  const uint32_t group = tile / group_tiles;
  const uint32_t first_ty = group * group_rows;
  const uint32_t rows_here = min(tiles_y - first_ty, group_rows);
  const uint32_t in_group = tile - group * group_tiles;
  *ty = first_ty + in_group % rows_here;
  *tx = in_group / rows_here;
}

// ---- consumers: per tile, each thread reads its register blocks from the stage, releases the
// stage, then stores. Warp blocks wholly outside the matrix are skipped (warp-uniform): a box
// wholly outside was never loaded and its stage memory holds stale data.

// fp32. Lane -> (row group br in 0..7, column chunk bc in 0..3): lane bit 0 and bits 3-4 give br,
// bits 1-2 give bc. Why: ld.shared.v4 is served per quarter warp (8 lanes), conflict-free when the
// 8 lanes hit 8 different 16-byte bank groups. Lanes 0-7 take 4 chunks x 2 row groups; the two
// row groups differ in bit 2 of (row & 7) (4 rows each), so chunk ^ (row & 7) takes 8 different
// values. For the stores, the 8 lanes sharing a bc hold 8 consecutive row groups: 8 x 16 B = one
// full 128-byte line of an output row, 4 lines per warp store. A warp's blocks are the kRows / 32
// row slices of one 16-column quarter, so one warp writes 16 output rows of kRows * 4 bytes each.
// Blocks go through registers two at a time; the stage is released after the last reads.
template <typename Config, bool kVectorStore>
__device__ __forceinline__ void ConsumeTile(const uint8_t* stage, uint64_t* empty,
                                            uint32_t* __restrict__ out, int64_t rows,
                                            int64_t cols, int64_t r0, int64_t c0, int warp,
                                            int lane) {
  constexpr int kVec = kVecOf<uint32_t>;
  constexpr int kSlices = Config::kRows / 32;    // 32-row slices of the tile
  constexpr int kQuarters = Config::kBoxes * 2;  // 16-column quarters of the tile
  constexpr int kBlocks = kSlices * kQuarters / kConsumerWarps;  // warp blocks per warp
  constexpr int kBatch = kBlocks < 2 ? kBlocks : 2;               // held in registers at once
  static_assert(kBlocks * kConsumerWarps == kSlices * kQuarters, "warps share the tile evenly");
  static_assert(kBlocks % kBatch == 0, "whole batches");
  const int br = (lane & 1) | ((lane >> 3) << 1);
  const int bc = (lane >> 1) & 3;
#pragma unroll
  for (int j0 = 0; j0 < kBlocks; j0 += kBatch) {
    uint32_t v[kBatch][kVec][kVec];  // [warp block][tile row i][tile column k]
    bool live[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int wb = warp * kBlocks + j0 + j;
      const int rh = wb % kSlices;  // which 32-row slice of the tile
      const int cq = wb / kSlices;  // which 16-column quarter of the tile
      live[j] = r0 + rh * 32 < rows && c0 + cq * 16 < cols;
      if (!live[j]) continue;
      const uint8_t* box = stage + (cq >> 1) * Config::kBoxBytes;
      const int chunk = (cq & 1) * 4 + bc;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const uint4 q =
            *reinterpret_cast<const uint4*>(box + SwizzledOffset(rh * 32 + br * kVec + i, chunk));
        v[j][i][0] = q.x;
        v[j][i][1] = q.y;
        v[j][i][2] = q.z;
        v[j][i][3] = q.w;
      }
    }
    if (j0 + kBatch == kBlocks) sm90::MbarArrive(empty);  // the stage may be refilled now
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!live[j]) continue;
      const int wb = warp * kBlocks + j0 + j;
      const int rh = wb % kSlices;
      const int cq = wb / kSlices;
      const int64_t out_c = r0 + rh * 32 + br * kVec;  // first output column (= input row)
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int64_t out_r = c0 + cq * 16 + bc * kVec + k;  // output row (= input column)
        if (out_r >= cols) continue;
        uint32_t* dst = out + out_r * rows + out_c;
        if constexpr (kVectorStore) {
          // rows % 4 == 0 on this path, so a vector is wholly inside or wholly outside the row.
          if (out_c < rows) {
            StoreGlobal16(dst, v[j][0][k], v[j][1][k], v[j][2][k], v[j][3][k]);
          }
        } else {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            if (out_c + i < rows) dst[i] = v[j][i][k];
          }
        }
      }
    }
  }
}

// bf16. Lane -> (row group br = lane >> 3 in 0..3, column chunk bc = lane & 7). A thread's 8 rows
// start at a multiple of 8, so row & 7 is the same for all lanes of one load; the 8 lanes of a
// quarter warp therefore need 8 different chunks, i.e. the whole 128-byte box width. For the
// stores, the 4 lanes sharing a bc write 4 x 16 B = 64 contiguous bytes (half a line) of each of 8
// output rows per warp store; the warp holding the other 32 rows of the tile writes the other
// half at about the same time, so L2 still sees whole lines before they go to DRAM.
template <typename Config, bool kVectorStore>
__device__ __forceinline__ void ConsumeTile(const uint8_t* stage, uint64_t* empty,
                                            uint16_t* __restrict__ out, int64_t rows,
                                            int64_t cols, int64_t r0, int64_t c0, int warp,
                                            int lane) {
  constexpr int kVec = kVecOf<uint16_t>;
  constexpr int kBoxCols = TileShape<uint16_t>::kBoxCols;
  static_assert(Config::kRows == 64 && Config::kBoxes == 2,
                "bf16: 2 row halves x 2 boxes = one warp block per consumer warp");
  const int br = lane >> 3;
  const int bc = lane & 7;
  const int rh = warp & 1;   // which 32-row half of the tile
  const int bx = warp >> 1;  // which box (64 columns) of the tile
  const bool live = r0 + rh * 32 < rows && c0 + bx * kBoxCols < cols;
  uint32_t v[kVec][4];  // [tile row i][word]: word w holds columns 2w, 2w + 1
  if (live) {
    const uint8_t* box = stage + bx * Config::kBoxBytes;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const uint4 q = *reinterpret_cast<const uint4*>(box + SwizzledOffset(rh * 32 + br * kVec + i, bc));
      v[i][0] = q.x;
      v[i][1] = q.y;
      v[i][2] = q.z;
      v[i][3] = q.w;
    }
  }
  sm90::MbarArrive(empty);  // the stage may be refilled while we store
  if (!live) return;
  const int64_t out_c = r0 + rh * 32 + br * kVec;  // first output column (= input row)
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t out_r = c0 + bx * kBoxCols + bc * kVec + k;  // output row (= input column)
    if (out_r >= cols) continue;
    uint16_t* dst = out + out_r * rows + out_c;
    if constexpr (kVectorStore) {
      // Output word w = (row 2w, row 2w + 1) of column k: the low halves (k even) or high halves
      // (k odd) of word k / 2 of two consecutive rows.
      constexpr uint32_t kSel[2] = {0x5410u, 0x7632u};
      uint32_t w[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) w[p] = __byte_perm(v[2 * p][k >> 1], v[2 * p + 1][k >> 1], kSel[k & 1]);
      // rows % 8 == 0 on this path, so a vector is wholly inside or wholly outside the row.
      if (out_c < rows) StoreGlobal16(dst, w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (out_c + i < rows) dst[i] = static_cast<uint16_t>(v[i][k >> 1] >> (16 * (k & 1)));
      }
    }
  }
}

#endif  // OPSERVE_SM90_ENABLED

// (kThreads, 1): without the 1, ptxas held the 64 x 2 fp32 kernel at 56 registers and spilled
// 12 bytes; with it, 70-100 registers and no spills, which still fits 3 CTAs of 160 threads.
template <typename T, bool kVectorStore, typename Config>
__global__ void __launch_bounds__(kThreads, Config::kMinCtas)
    transpose_tma_kernel(const __grid_constant__ CUtensorMap in_map, T* __restrict__ out,
                         int64_t rows, int64_t cols, uint32_t tiles_x, uint32_t tiles_y,
                         uint32_t num_tiles, uint32_t group_rows) {
#if defined(OPSERVE_SM90_ENABLED)
  constexpr int kStages = Config::kStages;
  constexpr int kBoxCols = TileShape<T>::kBoxCols;
  constexpr int kTileCols = Config::kBoxes * kBoxCols;
  extern __shared__ uint8_t smem_raw[];
  // Align the stages to 1024 bytes by hand (kSmemBytes reserves the slack): the alignment of the
  // dynamic shared-memory base is not something to rely on.
  uint8_t* smem =
      smem_raw + ((kSmemAlign - (sm90::SmemAddr(smem_raw) & (kSmemAlign - 1))) & (kSmemAlign - 1));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * Config::kTileBytes);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(&full[s], 1);                  // the producer's arrive (+ the TMA bytes)
      sm90::MbarInit(&empty[s], kConsumerThreads);  // every consumer thread's arrive
    }
    sm90::FenceMbarInit();
  }
  __syncthreads();  // the only block-wide barrier: below, the roles part ways

  if (warp == kConsumerWarps) {
    // Producer: one lane issues all copies; the other 31 lanes have nothing to do.
    if (lane != 0) return;
    PrefetchTensorMap(&in_map);
    int stage = 0;
    uint32_t phase = 0;
    for (uint32_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      uint32_t ty, tx;
      TileCoords(tile, tiles_x, tiles_y, group_rows, &ty, &tx);
      const int32_t r0 = static_cast<int32_t>(ty * Config::kRows);
      const int32_t c0 = static_cast<int32_t>(tx * kTileCols);
      // Boxes that start past the last column are not requested (the consumers skip them).
      const int64_t left = cols - c0;
      const int boxes = left >= kTileCols ? Config::kBoxes
                                          : static_cast<int>((left + kBoxCols - 1) / kBoxCols);
      sm90::MbarWaitParity(&empty[stage], phase ^ 1);  // all consumers are done reading this stage
      sm90::MbarArriveExpectTx(&full[stage], boxes * Config::kBoxBytes);
      uint8_t* dst = smem + stage * Config::kTileBytes;
      for (int b = 0; b < boxes; ++b) {
        sm90::TmaLoad2d(dst + b * Config::kBoxBytes, &in_map, c0 + b * kBoxCols, r0, &full[stage]);
      }
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    return;
  }

  // Consumers.
  int stage = 0;
  uint32_t phase = 0;
  for (uint32_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    uint32_t ty, tx;
    TileCoords(tile, tiles_x, tiles_y, group_rows, &ty, &tx);
    const int64_t r0 = static_cast<int64_t>(ty) * Config::kRows;
    const int64_t c0 = static_cast<int64_t>(tx) * kTileCols;
    sm90::MbarWaitParity(&full[stage], phase);
    ConsumeTile<Config, kVectorStore>(smem + stage * Config::kTileBytes, &empty[stage], out, rows,
                                      cols, r0, c0, warp, lane);
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
#else
  // A pass below 9.0 has no TMA: LaunchTma never launches this build (kernels/sm90/arch.h).
  __trap();
#endif
}

template <typename T, typename Config>
cudaError_t LaunchTma(const TransposeTmaTuning& tuning, const void* d_in, void* d_out,
                      int64_t rows, int64_t cols, int device, cudaStream_t stream,
                      bool* launched) {
  *launched = false;
  constexpr int kEb = static_cast<int>(sizeof(T));
  constexpr int kTileCols = Config::kBoxes * TileShape<T>::kBoxCols;
  const uint64_t tiles_x = static_cast<uint64_t>(CeilDiv<int64_t>(cols, kTileCols));
  const uint64_t tiles_y = static_cast<uint64_t>(CeilDiv<int64_t>(rows, Config::kRows));
  // 32-bit tile indices, with room for `tile += gridDim.x` not to wrap. Never hit in practice: a
  // 2^31-tile fp32 matrix would be 2^45 bytes.
  if (tiles_x * tiles_y >= (uint64_t{1} << 31)) return cudaSuccess;  // not launched: refused

  // Boxes are 128 bytes x kRows rows. 128-byte promotion fetches each box row as one whole line;
  // 256 bytes also fetches the neighbouring box's line (when rows are not 256-byte aligned it
  // re-reads half a line of the previous tile from DRAM). Chosen by measurement
  // (tuning.l2_promote_256).
  CUtensorMap map;
  if (!sm90::EncodeSwizzled128(&map, TileShape<T>::kDataType, d_in, rows, cols, kEb,
                               Config::kRows, TileShape<T>::kBoxCols,
                               tuning.l2_promote_256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                                     : CU_TENSOR_MAP_L2_PROMOTION_L2_128B)) {
    return cudaSuccess;  // not launched: refused
  }

  // Output rows start 16-byte aligned only if rows * elem_bytes is a multiple of 16.
  const bool vector_store =
      (rows * kEb) % 16 == 0 && reinterpret_cast<uintptr_t>(d_out) % 16 == 0;
  const auto kernel = vector_store ? transpose_tma_kernel<T, true, Config>
                                   : transpose_tma_kernel<T, false, Config>;
  // The device is 9.0 or newer (checked by the caller), but the build may hold no pass for it
  // with TMA (OPSERVE_CUDA_ARCHS=80-virtual): then the loaded kernel is the trap. Both variants
  // come from one pass, and a process serves one device: asked once, not per launch.
  static const bool loaded_for_sm90 = sm90::LoadedForSm90(reinterpret_cast<const void*>(kernel));
  if (!loaded_for_sm90) return cudaErrorNotSupported;

  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes);
  if (err != cudaSuccess) return err;
  int ctas_per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads,
                                                      Config::kSmemBytes);
  if (err != cudaSuccess) return err;
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const uint64_t num_tiles = tiles_x * tiles_y;
  const uint64_t resident =
      static_cast<uint64_t>(sms) * std::clamp(ctas_per_sm, 1, std::max(1, tuning.max_ctas_per_sm));
  // One tile per CTA: as many CTAs as tiles (under 2^31, checked above), dispatched in tile order.
  const unsigned grid = static_cast<unsigned>(
      Config::kStages == 1 ? num_tiles : std::min(num_tiles, resident));
  // A group never exceeds the tile column (so group_rows * tiles_x < 2^31: no overflow in
  // TileCoords); 0 or less means the whole column, i.e. tiles walk column-major.
  const uint64_t group_rows = tuning.group_tile_rows <= 0
                                  ? tiles_y
                                  : std::min<uint64_t>(tiles_y, tuning.group_tile_rows);
  kernel<<<grid, kThreads, Config::kSmemBytes, stream>>>(
      map, static_cast<T*>(d_out), rows, cols, static_cast<uint32_t>(tiles_x),
      static_cast<uint32_t>(tiles_y), static_cast<uint32_t>(num_tiles),
      static_cast<uint32_t>(group_rows));
  *launched = true;
  return cudaPeekAtLastError();
}

using LaunchFn = cudaError_t (*)(const TransposeTmaTuning&, const void*, void*, int64_t, int64_t,
                                 int, cudaStream_t, bool*);

// Every fp32 build, described by its config: a new tile is one `using` above plus one entry here.
struct Fp32Build {
  int tile_rows, boxes;
  bool one_tile;  // a single stage, a CTA per tile
  bool regs4;     // registers capped for 4 CTAs per SM
  LaunchFn launch;
};
template <typename Config>
constexpr Fp32Build BuildOf() {
  return {Config::kRows, Config::kBoxes, Config::kStages == 1, Config::kMinCtas >= 4,
          &LaunchTma<uint32_t, Config>};
}
constexpr Fp32Build kFp32Builds[] = {
    BuildOf<Tile64x2>(),        BuildOf<Tile64x4>(),         BuildOf<Tile128x2>(),
    BuildOf<Tile128x4>(),       BuildOf<Tile32x2Single>(),   BuildOf<Tile32x4Single>(),
    BuildOf<Tile64x2Single>(),  BuildOf<Tile64x4Single>(),   BuildOf<Tile128x2Single>(),
    BuildOf<Tile128x4Single>(), BuildOf<Tile256x2Single>(),  BuildOf<Tile64x2Single4>(),
    BuildOf<Tile32x4Single4>(),
};

// The fp32 build the tuning names; cudaErrorInvalidValue when there is none. One-tile tunings with
// max_ctas_per_sm >= 4 take the register-capped build where one exists.
cudaError_t LaunchTmaFp32(const TransposeTmaTuning& t, const void* d_in, void* d_out, int64_t rows,
                          int64_t cols, int device, cudaStream_t stream, bool* launched) {
  const Fp32Build* found = nullptr;
  for (const Fp32Build& b : kFp32Builds) {
    if (b.tile_rows != t.tile_rows || b.boxes != t.boxes || b.one_tile != t.one_tile_per_cta) {
      continue;
    }
    if (b.regs4 == (t.one_tile_per_cta && t.max_ctas_per_sm >= 4)) {
      found = &b;
      break;
    }
    if (!b.regs4 && found == nullptr) found = &b;
  }
  if (found == nullptr) return cudaErrorInvalidValue;
  return found->launch(t, d_in, d_out, rows, cols, device, stream, launched);
}

// bf16 has one build, the persistent 64 x 2 tile; cudaErrorInvalidValue for a tuning that names
// another tile or the one-tile-per-CTA form, rather than running this one in its place.
cudaError_t LaunchTmaBf16(const TransposeTmaTuning& t, const void* d_in, void* d_out, int64_t rows,
                          int64_t cols, int device, cudaStream_t stream, bool* launched) {
  if (t.tile_rows != Tile64x2::kRows || t.boxes != Tile64x2::kBoxes || t.one_tile_per_cta) {
    return cudaErrorInvalidValue;
  }
  return LaunchTma<uint16_t, Tile64x2>(t, d_in, d_out, rows, cols, device, stream, launched);
}

}  // namespace

bool TransposeTmaSupports(int64_t rows, int64_t cols, int elem_bytes) {
  // What a TMA tensor map can describe: a 16-byte multiple row stride (the base is 16-byte
  // aligned too: checked at launch), dimensions whose coordinates fit the instruction's signed
  // 32-bit operands; and the element sizes this file has consumers for.
  constexpr int64_t kMaxDim = INT32_MAX;
  return (elem_bytes == 2 || elem_bytes == 4) && rows >= 1 && cols >= 1 &&
         (cols * elem_bytes) % 16 == 0 && rows <= kMaxDim && cols <= kMaxDim;
}

cudaError_t TransposeTmaTuned(const TransposeTmaTuning& tuning, const void* d_in, void* d_out,
                              int64_t rows, int64_t cols, int elem_bytes, cudaStream_t stream) {
  if (!transpose_detail::ArgsOk(d_in, d_out, rows, cols, elem_bytes) ||
      !TransposeTmaSupports(rows, cols, elem_bytes) || reinterpret_cast<uintptr_t>(d_in) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int major = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  if (major < 9 || sm90::EncodeTiledFn() == nullptr) return cudaErrorNotSupported;
  bool launched = false;
  err = elem_bytes == 4
            ? LaunchTmaFp32(tuning, d_in, d_out, rows, cols, device, stream, &launched)
            : LaunchTmaBf16(tuning, d_in, d_out, rows, cols, device, stream, &launched);
  if (err == cudaSuccess && !launched) return cudaErrorInvalidValue;
  return err;
}

TransposeTmaTuning TransposeTmaDefaultTuning(int elem_bytes) {
  return elem_bytes == 2 ? kDefaultTuningBf16 : kDefaultTuning;
}

cudaError_t TransposeTma(const void* d_in, void* d_out, int64_t rows, int64_t cols, int elem_bytes,
                         cudaStream_t stream) {
  return TransposeTmaTuned(TransposeTmaDefaultTuning(elem_bytes), d_in, d_out, rows, cols,
                           elem_bytes, stream);
}

}  // namespace opserve::kernels
