// The warp-tiled matmul kernel (kernels/matmul_warp_tiled.cu), a template over its tile
// configuration: the table's row instantiates the configurations it runs, and opserve-bench's
// diagnostic bench/diag/matmul_sweep.cu times others. Private to the kernel layer and that
// diagnostic. See matmul_warp_tiled.cu for the method.
#pragma once

#include "kernels/matmul_common.cuh"

namespace opserve::kernels::warp_tiled {

using matmul::TileCoord;

constexpr int kWarp = 32;
constexpr int kAPad = 4;

// A block tile BM x BN, chunks BK deep; warp tiles WM x WN, each walked as WMITER x WNITER
// sub-tiles of TM x TN outputs a thread; THREADS threads a block.
// Tiles walk in groups of GROUPM tile rows.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int WNITER_, int TM_, int TN_, int THREADS_,
          int GROUPM_ = 8>
struct Config {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, WNITER = WNITER_;
  static constexpr int GROUPM = GROUPM_;
  static constexpr int TM = TM_, TN = TN_, THREADS = THREADS_;
  static constexpr int WMITER = (WM * WN) / (kWarp * TM * TN * WNITER);
  static constexpr int WSUBM = WM / WMITER, WSUBN = WN / WNITER;
  static constexpr int AStride = BM + kAPad;
  // Global loads per chunk: float4s of A and of B each thread carries.
  static constexpr int ALoads = BM * BK / 4 / THREADS;
  static constexpr int BLoads = BK * BN / 4 / THREADS;
  static_assert((BM / WM) * (BN / WN) * kWarp == THREADS, "warps tile the block");
  static_assert(WMITER >= 1 && WMITER * kWarp * TM * TN * WNITER == WM * WN, "threads tile a warp");
  static_assert((WSUBN / TN) * (WSUBM / TM) == kWarp, "a sub-tile is one warp's threads");
  static_assert(TM % 4 == 0 && TN % 4 == 0, "float4 reads of A and B");
  static_assert(ALoads >= 1 && ALoads * THREADS * 4 == BM * BK, "whole float4s of A per thread");
  static_assert(BLoads >= 1 && BLoads * THREADS * 4 == BK * BN, "whole float4s of B per thread");
  static_assert(BK % 4 == 0 && THREADS % (BK / 4) == 0 && THREADS % (BN / 4) == 0, "load grid");
  // Floats of one shared stage: A transposed [BK][AStride], then B [BK][BN]; two stages.
  static constexpr int StageFloats = BK * AStride + BK * BN;
  static constexpr int RingBytes = 2 * StageFloats * 4;
};

// One thread's place in the block: warp (warp_row, warp_col), (t_row, t_col) in the warp, and the
// first row / column of the block tile its outputs start at.
template <typename Cfg>
struct ThreadPlace {
  int m_base, n_base;
  __device__ ThreadPlace() {
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int warp_col = warp % (Cfg::BN / Cfg::WN);
    const int warp_row = warp / (Cfg::BN / Cfg::WN);
    const int t_col = lane % (Cfg::WSUBN / Cfg::TN);
    const int t_row = lane / (Cfg::WSUBN / Cfg::TN);
    m_base = warp_row * Cfg::WM + t_row * Cfg::TM;
    n_base = warp_col * Cfg::WN + t_col * Cfg::TN;
  }
};

template <typename Cfg>
using Accumulators = float[Cfg::WMITER * Cfg::TM][Cfg::WNITER * Cfg::TN];

// The math of one chunk: a = A^T [BK][AStride], b = B [BK][BN] in shared memory.
template <typename Cfg>
__device__ __forceinline__ void ChunkMath(const float* a, const float* b, const ThreadPlace<Cfg>& p,
                                          Accumulators<Cfg>& acc) {
  constexpr int TM = Cfg::TM, TN = Cfg::TN, WMITER = Cfg::WMITER, WNITER = Cfg::WNITER;
  constexpr int AS = Cfg::AStride;
  float reg_m[WMITER * TM];
  float reg_n[WNITER * TN];
#pragma unroll
  for (int dot = 0; dot < Cfg::BK; ++dot) {
#pragma unroll
    for (int wm = 0; wm < WMITER; ++wm) {
#pragma unroll
      for (int i = 0; i < TM; i += 4) {
        *reinterpret_cast<float4*>(&reg_m[wm * TM + i]) =
            *reinterpret_cast<const float4*>(&a[dot * AS + p.m_base + wm * Cfg::WSUBM + i]);
      }
    }
#pragma unroll
    for (int wn = 0; wn < WNITER; ++wn) {
#pragma unroll
      for (int j = 0; j < TN; j += 4) {
        *reinterpret_cast<float4*>(&reg_n[wn * TN + j]) =
            *reinterpret_cast<const float4*>(&b[dot * Cfg::BN + p.n_base + wn * Cfg::WSUBN + j]);
      }
    }
#pragma unroll
    for (int i = 0; i < WMITER * TM; ++i) {
#pragma unroll
      for (int j = 0; j < WNITER * TN; ++j) acc[i][j] += reg_m[i] * reg_n[j];
    }
  }
}

// C's block tile at (m0, n0) from the accumulators; kVector: float4 stores.
template <typename Cfg, bool kVector>
__device__ __forceinline__ void StoreC(float* __restrict__ d_c, int64_t m, int64_t n, int64_t m0,
                                       int64_t n0, const ThreadPlace<Cfg>& p,
                                       const Accumulators<Cfg>& acc) {
  constexpr int TM = Cfg::TM, TN = Cfg::TN;
#pragma unroll
  for (int wm = 0; wm < Cfg::WMITER; ++wm) {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int64_t row = m0 + p.m_base + wm * Cfg::WSUBM + i;
      if (row >= m) continue;
      float* c_row = d_c + row * n;
#pragma unroll
      for (int wn = 0; wn < Cfg::WNITER; ++wn) {
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
          const int64_t col = n0 + p.n_base + wn * Cfg::WSUBN + j;
          const float* v = &acc[wm * TM + i][wn * TN + j];
          if constexpr (kVector) {
            if (col < n) *reinterpret_cast<float4*>(c_row + col) = make_float4(v[0], v[1], v[2], v[3]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if (col + e < n) c_row[col + e] = v[e];
            }
          }
        }
      }
    }
  }
}

template <typename Cfg, typename T, bool kVector>
__global__ void __launch_bounds__(Cfg::THREADS)
    matmul_warp_tiled_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                             float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                             int64_t tiles_m, int64_t tiles_n) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
  constexpr int AS = Cfg::AStride;
  // Two stages of Cfg::StageFloats: A^T [k][m] (rows padded), then B [k][n].
  extern __shared__ __align__(16) float ring[];
  auto as = [&](int stage) { return ring + stage * Cfg::StageFloats; };
  auto bs = [&](int stage) { return ring + stage * Cfg::StageFloats + BK * AS; };

  const TileCoord tile = matmul::GroupedTile(tiles_m, tiles_n, Cfg::GROUPM);
  const int64_t m0 = tile.m * BM;
  const int64_t n0 = tile.n * BN;

  // Loads: A rows a_r + i * a_step, columns a_c..a_c+3 of the chunk; B rows b_r + i * b_step,
  // columns b_c..b_c+3.
  const int a_r = threadIdx.x / (BK / 4);
  const int a_c = threadIdx.x % (BK / 4) * 4;
  constexpr int a_step = Cfg::THREADS / (BK / 4);
  const int b_r = threadIdx.x / (BN / 4);
  const int b_c = threadIdx.x % (BN / 4) * 4;
  constexpr int b_step = Cfg::THREADS / (BN / 4);
  const int64_t b_col = n0 + b_c;
  const bool b_col_ok = b_col < n;

  float4 pa[Cfg::ALoads], pb[Cfg::BLoads];
  // The chunk at depth k0 into registers.
  auto load = [&](int64_t k0) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < Cfg::ALoads; ++i) {
      const int64_t row = m0 + a_r + i * a_step;
      const int64_t col = k0 + a_c;
      if constexpr (kVector) {
        pa[i] = (row < m && col < k) ? matmul::Load4(d_a + row * k + col) : zero;
      } else {
        pa[i] = row < m ? matmul::Load4Guarded(d_a + row * k + col, col, k) : zero;
      }
    }
#pragma unroll
    for (int i = 0; i < Cfg::BLoads; ++i) {
      const int64_t row = k0 + b_r + i * b_step;
      if constexpr (kVector) {
        pb[i] = (row < k && b_col_ok) ? matmul::Load4(d_b + row * n + b_col) : zero;
      } else {
        pb[i] = row < k ? matmul::Load4Guarded(d_b + row * n + b_col, b_col, n) : zero;
      }
    }
  };
  auto store = [&](int stage) {
#pragma unroll
    for (int i = 0; i < Cfg::ALoads; ++i) {
      float* a = as(stage) + a_r + i * a_step;
      a[(a_c + 0) * AS] = pa[i].x;
      a[(a_c + 1) * AS] = pa[i].y;
      a[(a_c + 2) * AS] = pa[i].z;
      a[(a_c + 3) * AS] = pa[i].w;
    }
#pragma unroll
    for (int i = 0; i < Cfg::BLoads; ++i) {
      *reinterpret_cast<float4*>(bs(stage) + (b_r + i * b_step) * BN + b_c) = pb[i];
    }
  };

  const ThreadPlace<Cfg> place;
  Accumulators<Cfg> acc = {};

  load(0);
  store(0);
  __syncthreads();
  int stage = 0;
  for (int64_t k0 = 0; k0 < k; k0 += BK) {
    const bool has_next = k0 + BK < k;
    if (has_next) load(k0 + BK);  // in flight during the math
    ChunkMath<Cfg>(as(stage), bs(stage), place, acc);
    // The other stage was last read before the barrier that ended the previous chunk.
    if (has_next) store(stage ^ 1);
    __syncthreads();
    stage ^= 1;
  }
  StoreC<Cfg, kVector>(d_c, m, n, m0, n0, place, acc);
}

template <typename Cfg, typename T>
cudaError_t LaunchCfg(bool vector, const T* d_a, const T* d_b, float* d_c, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream) {
  auto kernel = vector ? matmul_warp_tiled_kernel<Cfg, T, true> : matmul_warp_tiled_kernel<Cfg, T, false>;
  if constexpr (Cfg::RingBytes > 48 * 1024) {
    // Per launch, not once: the attribute belongs to the current device's context.
    const cudaError_t attr = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::RingBytes);
    if (attr != cudaSuccess) return attr;
  }
  return matmul::WithTileGrid(m, n, Cfg::BM, Cfg::BN, [&](unsigned blocks, int64_t tiles_m,
                                                          int64_t tiles_n) {
    kernel<<<blocks, Cfg::THREADS, Cfg::RingBytes, stream>>>(d_a, d_b, d_c, m, n, k, tiles_m,
                                                             tiles_n);
    return LastLaunchError();
  });
}

// Whether the vector path (16-byte loads of A and B, float4 stores of C) takes these operands.
template <typename T>
bool VectorPath(const T* d_a, const T* d_b, const float* d_c, int64_t n, int64_t k) {
  const size_t vec_bytes = 4 * sizeof(T);
  return k % 4 == 0 && n % 4 == 0 && matmul::IsAligned(d_a, vec_bytes) &&
         matmul::IsAligned(d_b, vec_bytes) && matmul::IsAligned(d_c, 16);
}

}  // namespace opserve::kernels::warp_tiled
