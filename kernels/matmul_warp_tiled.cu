// matmul, step 7 of siboehm's SGEMM_CUDA progression (warp tiling, his kernel 10) with his
// kernel 11's double buffering: the block tile is split into warp tiles, and each warp's
// threads compute WMITER x WNITER sub-tiles of TM x TN outputs, so a warp reads the shared
// memory of its own 64 x 64 (or 64 x 32) patch and each thread's loads of A and B feed more
// FMAs than in block_tiled_vectorized (6 16-byte shared loads per 128 FMAs, against 4 per 64).
// The shared stages are dynamic shared memory (the large configuration needs more than 48 KiB).
//   - block tile BM x BN, chunk depth BK; A stored transposed in shared memory (A^T [k][m], rows
//     padded by 4 floats) so a thread reads its TM rows of A as float4s; B as it is ([k][n]);
//   - two shared-memory stages: the next chunk is loaded into registers during the current
//     chunk's math and stored to the other stage after it, one barrier per chunk;
//   - tiles walk in grouped order (kGroupM tile rows at a time), so blocks running together
//     share A and B panels in L2.
// The configuration is chosen per shape class (Large and Small below, from a sweep): 256 x 128
// tiles for C of at least kSmallTiles of them, 128 x 64 below that, where fewer, smaller blocks
// fill the SMs better.
// Vector loads need K and N multiples of 4 and aligned bases; other shapes run the same kernel
// with per-element guarded loads and stores (kVector = false).
#include "kernels/matmul.h"
#include "kernels/matmul_warp_tiled.cuh"

namespace opserve::kernels {
namespace {

using warp_tiled::Config;

// The configurations, chosen by bench/diag/matmul_sweep.cu on the H200 (docs/performance/history.md), tile
// shapes and thread mappings against cuBLAS's pedantic SGEMM at 1024^3, 4096^3 and 8192^3.
// Large C: 256 x 128 x 16 tiles, 8 warps of 64 x 64, each thread 16 x 8 outputs as 4 x 2 blocks
// of 4 x 4. A thread's four 4-row blocks lie 16 rows apart, so a warp's loads of A^T read 4
// adjacent float4s, conflict-free; with 8 consecutive rows a thread (8 x 16 outputs) they read
// 8 float4s 32 bytes apart, two on each set of banks. BK 16 halves the barriers per K and needs
// more than 48 KiB of shared memory (dynamic, opted in).
using Large = Config<256, 128, 16, 64, 64, 2, 4, 4, 256>;
// Small C: 128 x 64 x 16 tiles, 4 warps of 64 x 32, each thread 8 x 8 outputs: the fastest at
// 1024^3, where Large makes 32 blocks for 132 SMs.
using Small = Config<128, 64, 16, 64, 32, 2, 8, 4, 128>;
// Below this many Large tiles (two per SM of an H100 / H200) Small fills the GPU better.
constexpr int64_t kSmallTiles = 264;

template <typename T>
cudaError_t Launch(const T* d_a, const T* d_b, float* d_c, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  const bool vector = warp_tiled::VectorPath(d_a, d_b, d_c, n, k);
  if (matmul::TileCount(m, n, Large::BM, Large::BN) >= kSmallTiles) {
    return warp_tiled::LaunchCfg<Large>(vector, d_a, d_b, d_c, m, n, k, stream);
  }
  return warp_tiled::LaunchCfg<Small>(vector, d_a, d_b, d_c, m, n, k, stream);
}

}  // namespace

OPSERVE_DEFINE_MATMUL(MatmulWarpTiled, Launch)

}  // namespace opserve::kernels
