// matmul on the tensor cores through mma.sync (sm_80-style, runs on any sm_90):
//   FLOAT32 inputs: TF32 mma.m16n8k8, each operand rounded to TF32 with cvt.rna.tf32.f32;
//   BFLOAT16 inputs: BF16 mma.m16n8k16; both accumulate in float32.
//
// Design (the CUTLASS sm_80 multistage GEMM, reduced to one file):
//   - a block of 4 warps computes a 128 x 128 tile of C; each warp a 64 x 64 sub-tile, i.e. 4 x 8
//     mma tiles of 16 x 8 with 128 float accumulators a thread;
//   - K advances in chunks of 128 bytes of an A row (32 floats / 64 bf16); chunks of A and B are
//     copied into a kStages-deep shared-memory ring with cp.async (16-byte, L2-only), so the
//     copies of chunks c+1 .. c+kStages-1 are in flight while chunk c is multiplied; one
//     __syncthreads per chunk;
//   - A fragments come from ldmatrix.x4 (rows of 16 bytes: 4 tf32 or 8 bf16); B fragments from
//     ldmatrix.x4.trans for bf16 and from single 32-bit shared loads for tf32 (.trans works on
//     16-bit elements only);
//   - shared rows are padded by 16 bytes (A, bf16 B) or 32 bytes (tf32 B) so that the ldmatrix
//     rows and the tf32 B loads of a warp fall in distinct banks;
//   - zero-filled cp.async (src-size 0) for chunks past M, N or K, guarded stores of C;
//   - blocks are ordered in groups of kGroupM tile rows so that concurrent blocks share A and B
//     panels in L2.
// cp.async needs 16-byte aligned rows: K and N multiples of 4 floats / 8 bf16 and 16-byte aligned
// bases. Other shapes take the same kernel with kAsync = false, which loads each element with a
// guarded ordinary load and stores it to shared memory (same ring, no overlap).
//
// The Hopper wgmma + TMA kernel is its own algorithm (kernels/matmul_tensor_core_sm90a.cu); this
// one never switches to it, so the algorithm a response reports is the kernel that ran.
#include <cstdint>
#include <type_traits>

#include "kernels/matmul.h"
#include <algorithm>

#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kBM = 128;     // rows of C per block
constexpr int kBN = 128;     // columns of C per block
constexpr int kWM = 64;      // rows of C per warp
constexpr int kWN = 64;      // columns of C per warp
constexpr int kMmaM = 16;    // mma tile rows
constexpr int kMmaN = 8;     // mma tile columns
constexpr int kChunkBytes = 16;  // one cp.async / one ldmatrix row
constexpr int kRowBytesA = 128;  // bytes of an A row per K chunk
constexpr int kStages = 3;       // depth of the shared-memory ring
constexpr int kGroupM = 8;       // tile rows per L2-friendly group of blocks
constexpr int kMinBlocksPerSm = 2;
constexpr int kWarpsM = kBM / kWM;
constexpr int kWarpsN = kBN / kWN;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kMTiles = kWM / kMmaM;  // mma tiles per warp, down M
constexpr int kNTiles = kWN / kMmaN;  // mma tiles per warp, across N
static_assert((kBN % kWN == 0) && (kBM % kWM == 0), "warp tiles must tile the block tile");
static_assert(kWM % kMmaM == 0 && kWN % kMmaN == 0, "mma tiles must tile the warp tile");
static_assert(kNTiles % 2 == 0, "bf16 B fragments are loaded two n-tiles per ldmatrix.x4");
static_assert(kStages >= 2, "the ring needs at least double buffering");

// Per input type: the mma shape's K and the shared-memory layout.
template <typename T>
struct TcConfig;
template <>
struct TcConfig<float> {
  static constexpr int kMmaK = 8;
  static constexpr int kBPadElems = 8;  // 136-word rows: the 4 k-rows x 8 columns of a tf32 B
                                        // fragment load land in 32 distinct banks
};
template <>
struct TcConfig<__nv_bfloat16> {
  static constexpr int kMmaK = 16;
  static constexpr int kBPadElems = 8;  // 68-word rows: 8 ldmatrix rows in distinct banks
};

template <typename T>
struct TcLayout {
  static constexpr int kElemBytes = sizeof(T);
  static constexpr int kChunkElems = kChunkBytes / kElemBytes;        // elements per cp.async
  static constexpr int kBK = kRowBytesA / kElemBytes;                 // K per chunk
  static constexpr int kMmaK = TcConfig<T>::kMmaK;
  static constexpr int kAStride = kBK + kChunkElems;                  // 144-byte rows
  static constexpr int kBStride = kBN + TcConfig<T>::kBPadElems;
  static constexpr int kAStageElems = kBM * kAStride;
  static constexpr int kBStageElems = kBK * kBStride;
  static constexpr int kStageBytes = (kAStageElems + kBStageElems) * kElemBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kAChunksPerRow = kBK / kChunkElems;
  static constexpr int kBChunksPerRow = kBN / kChunkElems;
  static constexpr int kAChunksPerThread = kBM * kAChunksPerRow / kThreads;
  static constexpr int kBChunksPerThread = kBK * kBChunksPerRow / kThreads;

  static_assert(kBK % kMmaK == 0, "mma steps must tile the K chunk");
  static_assert((kAStride * kElemBytes) % 16 == 0 && (kBStride * kElemBytes) % 16 == 0,
                "shared rows must stay 16-byte aligned for cp.async and ldmatrix");
  static_assert((kAStride * kElemBytes / 4) % 32 == 4,
                "A rows 4 banks apart: an ldmatrix's 8 rows hit distinct bank quads");
  static_assert((kBM * kAChunksPerRow) % kThreads == 0, "A chunk copies split evenly");
  static_assert((kBK * kBChunksPerRow) % kThreads == 0, "B chunk copies split evenly");
  static_assert(kThreads % kAChunksPerRow == 0 && kThreads % kBChunksPerRow == 0,
                "a thread keeps the same column of chunks in every pass");
  static_assert(kSmemBytes * kMinBlocksPerSm <= 227 * 1024, "ring must fit twice per SM");
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; src_bytes = 0 writes 16 zero bytes.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ uint32_t ToTf32(uint32_t bits) {
  uint32_t out;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(out) : "f"(__uint_as_float(bits)));
  return out;
}

__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    float) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The raw bits of one element, for the synchronous (unaligned) copy path.
template <typename T>
using ElemBits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;

template <typename T, bool kAsync>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    matmul_tensor_core_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                              float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                              int64_t tiles_m, int64_t tiles_n) {
  using L = TcLayout<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const a_s = reinterpret_cast<T*>(smem);                             // [stage][kBM][kAStride]
  T* const b_s = reinterpret_cast<T*>(smem) + kStages * L::kAStageElems;  // [stage][kBK][kBStride]

  const TileCoord tile = matmul::GroupedTile(tiles_m, tiles_n, kGroupM);
  const int64_t m0 = tile.m * kBM;
  const int64_t n0 = tile.n * kBN;
  const int tid = threadIdx.x;

  // ---- Copy placement. Pass p copies the 16-byte chunk at column a_col of A row
  // a_r + p * kARowsPerPass, and the one at column b_col of B row b_r + p * kBRowsPerPass.
  constexpr int kARowsPerPass = kThreads / L::kAChunksPerRow;
  constexpr int kBRowsPerPass = kThreads / L::kBChunksPerRow;
  const int a_r = tid / L::kAChunksPerRow;
  const int a_col = tid % L::kAChunksPerRow * L::kChunkElems;
  const int b_r = tid / L::kBChunksPerRow;
  const int b_col = tid % L::kBChunksPerRow * L::kChunkElems;
  const int64_t a_rows_left = m - m0 - a_r;  // pass p is in range while p * rows/pass < this
  const T* const a_base = d_a + (m0 + (a_rows_left > 0 ? a_r : 0)) * k + a_col;  // in bounds
  const bool b_col_ok = n0 + b_col < n;
  const T* const b_base = d_b + static_cast<int64_t>(b_r) * n + (b_col_ok ? n0 + b_col : 0);

  // Copies K chunk `chunk` into ring slot `stage` (all threads, kA/kBChunksPerThread each).
  auto load_chunk = [&](int64_t chunk, int stage) {
    const int64_t k0 = chunk * L::kBK;
    T* const a_dst = a_s + stage * L::kAStageElems + a_r * L::kAStride + a_col;
    T* const b_dst = b_s + stage * L::kBStageElems + b_r * L::kBStride + b_col;
    const int64_t a_k_left = k - k0 - a_col;  // elements of this A row from the chunk column on
    // The synchronous path is not unrolled: its per-element loads would otherwise spill.
#pragma unroll(kAsync ? L::kAChunksPerThread : 1)
    for (int p = 0; p < L::kAChunksPerThread; ++p) {
      const bool row_ok = p * kARowsPerPass < a_rows_left;
      const T* src = a_base + static_cast<int64_t>(p * kARowsPerPass) * k + k0;
      T* dst = a_dst + p * kARowsPerPass * L::kAStride;
      if constexpr (kAsync) {
        // K is a multiple of kChunkElems: a chunk is wholly inside or outside the row.
        const bool ok = row_ok && a_k_left > 0;
        CpAsync16(SmemAddr(dst), ok ? src : d_a, ok ? kChunkBytes : 0);
      } else {
        alignas(16) ElemBits<T> v[L::kChunkElems];
        const ElemBits<T>* s = reinterpret_cast<const ElemBits<T>*>(src);
#pragma unroll
        for (int e = 0; e < L::kChunkElems; ++e) v[e] = (row_ok && e < a_k_left) ? s[e] : 0;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      }
    }
#pragma unroll(kAsync ? L::kBChunksPerThread : 1)
    for (int p = 0; p < L::kBChunksPerThread; ++p) {
      const bool row_ok = k0 + b_r + p * kBRowsPerPass < k;
      const T* src = b_base + (k0 + p * kBRowsPerPass) * n;
      T* dst = b_dst + p * kBRowsPerPass * L::kBStride;
      if constexpr (kAsync) {
        const bool ok = row_ok && b_col_ok;  // N is a multiple of kChunkElems
        CpAsync16(SmemAddr(dst), ok ? src : d_b, ok ? kChunkBytes : 0);
      } else {
        alignas(16) ElemBits<T> v[L::kChunkElems];
        const ElemBits<T>* s = reinterpret_cast<const ElemBits<T>*>(src);
#pragma unroll
        for (int e = 0; e < L::kChunkElems; ++e) {
          v[e] = (row_ok && n0 + b_col + e < n) ? s[e] : 0;
        }
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      }
    }
  };

  // ---- Compute placement.
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wm = warp / kWarpsN * kWM;  // warp tile origin inside the block tile
  const int wn = warp % kWarpsN * kWN;
  const int group = lane / 4;   // mma "groupID": row of A / column of B within a fragment
  const int quad = lane % 4;    // mma "threadID_in_group"
  // ldmatrix.x4: lanes 8j..8j+7 address the rows of matrix j. For A (row-major m x k), matrix j
  // is rows (j & 1) * 8 .. +7 and the 16-byte column j >> 1: this gives a0..a3 in mma order.
  const int ldm_row = lane % 16;
  const int ldm_col = lane / 16 * L::kChunkElems;
  // For bf16 B (k x n, n contiguous) with .trans, matrix j is k rows (j & 1) * 8 .. +7 and
  // columns (j >> 1) * 8 .. +7: b0, b1 of one n-tile, then b0, b1 of the next.
  const int ldm_b_k = (lane / 8 % 2) * 8 + lane % 8;
  const int ldm_b_n = lane / 16 * 8;

  float acc[kMTiles][kNTiles][4] = {};

  const int64_t chunks = CeilDiv<int64_t>(k, L::kBK);
  // Prologue: fill kStages - 1 slots. A group is committed even when empty so that the group
  // count stays fixed and wait_group<kStages - 2> always means "chunk c has landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) load_chunk(s, s);
    if constexpr (kAsync) CpAsyncCommit();
  }

  for (int64_t c = 0; c < chunks; ++c) {
    if constexpr (kAsync) CpAsyncWait<kStages - 2>();
    // After this barrier chunk c is visible to all threads, and every thread has finished
    // multiplying chunk c - 1, whose slot the copy below reuses.
    __syncthreads();
    {
      const int64_t next = c + kStages - 1;
      if (next < chunks) load_chunk(next, static_cast<int>(next % kStages));
      if constexpr (kAsync) CpAsyncCommit();
    }

    const int stage = static_cast<int>(c % kStages);
    const T* const a_stage = a_s + stage * L::kAStageElems;
    const T* const b_stage = b_s + stage * L::kBStageElems;
#pragma unroll
    for (int ks = 0; ks < L::kBK; ks += L::kMmaK) {
      uint32_t a_frag[kMTiles][4];
      uint32_t b_frag[kNTiles][2];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        LdMatrixX4(a_frag[i], SmemAddr(a_stage + (wm + i * kMmaM + ldm_row) * L::kAStride + ks +
                                       ldm_col));
      }
      if constexpr (std::is_same_v<T, float>) {
        const uint32_t* b32 = reinterpret_cast<const uint32_t*>(b_stage);
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          const int col = wn + j * kMmaN + group;
          b_frag[j][0] = ToTf32(b32[(ks + quad) * L::kBStride + col]);
          b_frag[j][1] = ToTf32(b32[(ks + quad + 4) * L::kBStride + col]);
        }
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a_frag[i][r] = ToTf32(a_frag[i][r]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kNTiles; j += 2) {
          uint32_t r[4];
          LdMatrixX4Trans(r, SmemAddr(b_stage + (ks + ldm_b_k) * L::kBStride + wn + j * kMmaN +
                                      ldm_b_n));
          b_frag[j][0] = r[0];
          b_frag[j][1] = r[1];
          b_frag[j + 1][0] = r[2];
          b_frag[j + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) Mma(acc[i][j], a_frag[i], b_frag[j], T{});
      }
    }
  }
  if constexpr (kAsync) CpAsyncWait<0>();  // only empty groups remain; leave none behind

  // ---- Epilogue: accumulator r of tile (i, j) is C[row + (r / 2) * 8][col + r % 2]. Two
  // adjacent columns go out as one float2 when N is even and C 8-byte aligned (kAsync implies it).
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + wm + i * kMmaM + h * 8 + group;
      if (row >= m) continue;
      float* const c_row = d_c + row * n;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int64_t col = n0 + wn + j * kMmaN + quad * 2;
        const float v0 = acc[i][j][h * 2 + 0];
        const float v1 = acc[i][j][h * 2 + 1];
        if constexpr (kAsync) {
          if (col < n) *reinterpret_cast<float2*>(c_row + col) = make_float2(v0, v1);
        } else {
          if (col < n) c_row[col] = v0;
          if (col + 1 < n) c_row[col + 1] = v1;
        }
      }
    }
  }
}

template <typename T>
cudaError_t Launch(const T* d_a, const T* d_b, float* d_c, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  using L = TcLayout<T>;
  static_assert(L::kSmemBytes <= std::max(TcLayout<float>::kSmemBytes,
                                          TcLayout<__nv_bfloat16>::kSmemBytes),
                "MatmulTensorCoreSharedBytes covers every dtype's ring");
  // 16-byte copies need every row start 16-byte aligned; the float2 stores of C need N even and
  // C 8-byte aligned (N a multiple of kChunkElems implies even).
  const bool async = k % L::kChunkElems == 0 && n % L::kChunkElems == 0 &&
                     matmul::IsAligned(d_a, kChunkBytes) && matmul::IsAligned(d_b, kChunkBytes) &&
                     matmul::IsAligned(d_c, 8);
  auto kernel = async ? matmul_tensor_core_kernel<T, /*kAsync=*/true>
                      : matmul_tensor_core_kernel<T, /*kAsync=*/false>;
  return matmul::WithTileGrid(m, n, kBM, kBN, [&](unsigned blocks, int64_t tiles_m,
                                                  int64_t tiles_n) {
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmemBytes);
    if (err != cudaSuccess) return err;
    kernel<<<blocks, kThreads, L::kSmemBytes, stream>>>(d_a, d_b, d_c, m, n, k, tiles_m, tiles_n);
    return LastLaunchError();
  });
}

}  // namespace

OPSERVE_DEFINE_MATMUL(MatmulTensorCore, Launch)

int MatmulTensorCoreSharedBytes() {
  return std::max(TcLayout<float>::kSmemBytes, TcLayout<__nv_bfloat16>::kSmemBytes);
}

}  // namespace opserve::kernels
