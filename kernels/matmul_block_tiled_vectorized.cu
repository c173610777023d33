// matmul, step 6 of siboehm's SGEMM_CUDA (vectorized 2-D blocktiling), with the refinements that
// take it to most of cuBLAS's FP32 rate (siboehm's steps 7-11 / the classic 128x128x8 SGEMM):
//   - global loads are 16-byte vectors (4 floats; 4 bf16 are an 8-byte vector), and the A chunk
//     is stored TRANSPOSED in shared memory (a_s[k][m]), so that the inner loop reads a thread's
//     A values as float4 like its B values;
//   - a thread's 8x8 outputs are four 4x4 quadrants 64 rows / columns apart, and a warp covers a
//     4 x 8 grid of threads: each float4 shared-memory read of a warp touches 4 (A) or 8 (B)
//     consecutive float4s, one wavefront, no bank conflicts;
//   - the transposed A rows are padded by 4 floats so that the transposing stores are
//     conflict-free while rows stay 16-byte aligned;
//   - two shared-memory stages with the next chunk prefetched into registers during the current
//     chunk's math: one __syncthreads per chunk, global latency hidden behind 512 FMAs a thread.
// Vector loads need row strides (K, N) that are multiples of 4 elements and aligned bases; other
// shapes take the same kernel with kVector = false (per-element guarded loads and stores).
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kBM = 128;   // rows of C per block
constexpr int kBN = 128;   // columns of C per block
constexpr int kBK = 8;     // depth of one shared-memory chunk
constexpr int kTM = 8;     // rows of C per thread (two quadrants of kQuad)
constexpr int kTN = 8;     // columns of C per thread (two quadrants of kQuad)
constexpr int kQuad = 4;   // a quadrant is kQuad x kQuad: one float4 of A times one of B
constexpr int kVec = 4;    // elements per global vector load
constexpr int kAPad = 4;   // floats of padding per transposed A row (see the header comment)
constexpr int kAStride = kBM + kAPad;
constexpr int kBStride = kBN;
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256
constexpr int kThreadsM = kBM / kTM;                 // 16 thread rows
constexpr int kThreadsN = kBN / kTN;                 // 16 thread columns
constexpr int kWarpThreadsM = 4;                     // a warp is 4 thread rows x 8 thread columns
constexpr int kWarpThreadsN = 8;
constexpr int kMinBlocksPerSm = 2;  // caps registers at 128: 64 accumulators + operands
constexpr int kGroupM = 8;          // tile rows per L2-friendly group of blocks

static_assert(kTM == 2 * kQuad && kTN == 2 * kQuad, "a thread owns 2x2 quadrants");
static_assert(kThreadsM * kQuad == kBM / 2 && kThreadsN * kQuad == kBN / 2,
              "the second quadrant of every thread starts half a block tile further on");
static_assert(kWarpThreadsM * kWarpThreadsN == 32, "a warp is a 4 x 8 grid of threads");
static_assert(kThreadsM % kWarpThreadsM == 0 && kThreadsN % kWarpThreadsN == 0,
              "warps tile the thread grid");
static_assert(kBM * kBK / kVec == kThreads, "one vector of the A chunk per thread");
static_assert(kBK * kBN / kVec == kThreads, "one vector of the B chunk per thread");
static_assert(kBK % kVec == 0 && kBN % kVec == 0, "vectors never straddle a chunk row");
static_assert(kAStride % 4 == 0, "transposed A rows must stay 16-byte aligned for float4 reads");
static_assert((kVec * kAStride) % 32 == 16,
              "the two A vectors of a row pair must land 16 banks apart (conflict-free stores)");

// One chunk's worth of this thread's global loads, carried in registers across the math.
struct Prefetch {
  float4 a;
  float4 b;
};

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    matmul_block_tiled_vectorized_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                                         float* __restrict__ d_c, int64_t m, int64_t n,
                                         int64_t k, int64_t tiles_m, int64_t tiles_n) {
  __shared__ __align__(16) float a_s[2][kBK * kAStride];  // [stage][k][m], transposed
  __shared__ __align__(16) float b_s[2][kBK * kBStride];  // [stage][k][n]

  const TileCoord tile = matmul::GroupedTile(tiles_m, tiles_n, kGroupM);
  const int64_t m0 = tile.m * kBM;
  const int64_t n0 = tile.n * kBN;

  // Load placement: A vector (row a_r, cols a_c..a_c+3), B vector (row b_r, cols b_c..b_c+3).
  const int a_r = threadIdx.x / (kBK / kVec);
  const int a_c = threadIdx.x % (kBK / kVec) * kVec;
  const int b_r = threadIdx.x / (kBN / kVec);
  const int b_c = threadIdx.x % (kBN / kVec) * kVec;
  const int64_t a_row = m0 + a_r;
  const bool a_row_ok = a_row < m;
  const T* a_ptr = d_a + (a_row_ok ? a_row : m0) * k + a_c;  // clamped rows stay in bounds
  const int64_t b_col = n0 + b_c;
  const bool b_col_ok = b_col < n;
  const T* b_ptr = d_b + static_cast<int64_t>(b_r) * n + (b_col_ok ? b_col : n0);

  // Loads of the chunk that starts k0 = k - k_left columns into A (rows into B); a_ptr and b_ptr
  // already point at that chunk.
  auto load_chunk = [&](const T* a, const T* b, int64_t k_left) {
    Prefetch p;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (kVector) {
      // K and N are multiples of kVec here, so a vector is either wholly inside or outside.
      p.a = (a_row_ok && a_c < k_left) ? matmul::Load4(a) : zero;
      p.b = (b_col_ok && b_r < k_left) ? matmul::Load4(b) : zero;
    } else {
      p.a = a_row_ok ? matmul::Load4Guarded(a, a_c, k_left) : zero;
      p.b = b_r < k_left ? matmul::Load4Guarded(b, b_col, n) : zero;
    }
    return p;
  };
  auto store_chunk = [&](const Prefetch& p, int stage) {
    float* a = a_s[stage];
    a[(a_c + 0) * kAStride + a_r] = p.a.x;  // transpose A on the way in
    a[(a_c + 1) * kAStride + a_r] = p.a.y;
    a[(a_c + 2) * kAStride + a_r] = p.a.z;
    a[(a_c + 3) * kAStride + a_r] = p.a.w;
    *reinterpret_cast<float4*>(&b_s[stage][b_r * kBStride + b_c]) = p.b;
  };

  // Compute placement: warp w covers thread rows (w / 2) * 4 .. +3, thread columns (w % 2) * 8
  // .. +7; thread (ty, tx) owns rows {ty*4, kBM/2 + ty*4} + 0..3 and the same for columns.
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  constexpr int kWarpsN = kThreadsN / kWarpThreadsN;
  const int ty = (warp / kWarpsN) * kWarpThreadsM + lane / kWarpThreadsN;
  const int tx = (warp % kWarpsN) * kWarpThreadsN + lane % kWarpThreadsN;
  const int quad_m = ty * kQuad;
  const int quad_n = tx * kQuad;

  float acc[kTM][kTN] = {};

  const int64_t b_chunk_stride = kBK * n;
  store_chunk(load_chunk(a_ptr, b_ptr, k), 0);
  __syncthreads();

  // k_left counts the columns of A from the current chunk on.
  for (int64_t k_left = k, c = 0; k_left > 0; k_left -= kBK, ++c) {
    const int stage = static_cast<int>(c & 1);
    const bool has_next = k_left > kBK;
    Prefetch next;
    if (has_next) {  // in flight during the math below
      a_ptr += kBK;
      b_ptr += b_chunk_stride;
      next = load_chunk(a_ptr, b_ptr, k_left - kBK);
    }

    const float* a = a_s[stage];
    const float* b = b_s[stage];
#pragma unroll
    for (int dot = 0; dot < kBK; ++dot) {
      float reg_m[kTM];
      float reg_n[kTN];
      *reinterpret_cast<float4*>(&reg_m[0]) =
          *reinterpret_cast<const float4*>(&a[dot * kAStride + quad_m]);
      *reinterpret_cast<float4*>(&reg_m[kQuad]) =
          *reinterpret_cast<const float4*>(&a[dot * kAStride + kBM / 2 + quad_m]);
      *reinterpret_cast<float4*>(&reg_n[0]) =
          *reinterpret_cast<const float4*>(&b[dot * kBStride + quad_n]);
      *reinterpret_cast<float4*>(&reg_n[kQuad]) =
          *reinterpret_cast<const float4*>(&b[dot * kBStride + kBN / 2 + quad_n]);
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += reg_m[i] * reg_n[j];
      }
    }

    // The other stage was last read in the previous iteration, which every thread finished
    // before the barrier that ended it, so it can be overwritten without another barrier.
    if (has_next) store_chunk(next, stage ^ 1);
    __syncthreads();
  }

  // Epilogue: rows quad_m + {0..3} and kBM/2 + quad_m + {0..3}; per row two runs of 4 columns.
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t row = m0 + (i < kQuad ? quad_m + i : kBM / 2 + quad_m + i - kQuad);
    if (row >= m) continue;
    float* c_row = d_c + row * n;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = n0 + h * (kBN / 2) + quad_n;
      const float* v = &acc[i][h * kQuad];
      if constexpr (kVector) {
        // N is a multiple of 4 here: the vector is wholly inside or outside.
        if (col < n) {
          *reinterpret_cast<float4*>(c_row + col) = make_float4(v[0], v[1], v[2], v[3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kQuad; ++j) {
          if (col + j < n) c_row[col + j] = v[j];
        }
      }
    }
  }
}

template <typename T>
cudaError_t Launch(const T* d_a, const T* d_b, float* d_c, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  // Vector loads of kVec elements need kVec * sizeof(T)-byte alignment of every row start, and
  // the float4 stores of C 16-byte alignment of every row of C.
  const size_t vec_bytes = kVec * sizeof(T);
  const bool vector = k % kVec == 0 && n % kVec == 0 && matmul::IsAligned(d_a, vec_bytes) &&
                      matmul::IsAligned(d_b, vec_bytes) && matmul::IsAligned(d_c, 16);
  auto kernel = vector ? matmul_block_tiled_vectorized_kernel<T, /*kVector=*/true>
                       : matmul_block_tiled_vectorized_kernel<T, /*kVector=*/false>;
  return matmul::WithTileGrid(m, n, kBM, kBN, [&](unsigned blocks, int64_t tiles_m,
                                                  int64_t tiles_n) {
    kernel<<<blocks, kThreads, 0, stream>>>(d_a, d_b, d_c, m, n, k, tiles_m, tiles_n);
    return LastLaunchError();
  });
}

}  // namespace

OPSERVE_DEFINE_MATMUL(MatmulBlockTiledVectorized, Launch)

}  // namespace opserve::kernels
