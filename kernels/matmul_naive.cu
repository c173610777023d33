// matmul, step 1 of siboehm's SGEMM_CUDA: one thread per output element, no reuse at all.
//
// Consecutive threadIdx.x are consecutive ROWS of C, so a warp reads 32 different rows of A
// (32 separate sectors per load) and writes C with a stride of N: the uncoalesced baseline that
// the next step fixes. Each A and B element is re-read from L2/DRAM by every thread that needs it.
#include "kernels/matmul.h"
#include "kernels/matmul_common.cuh"

namespace opserve::kernels {
namespace {

using matmul::TileCoord;

constexpr int kTile = 32;  // a block covers a kTile x kTile patch of C, one thread per element
static_assert(kTile * kTile <= 1024, "one thread per element of the block's patch");

template <typename T>
__global__ void __launch_bounds__(kTile * kTile)
    matmul_naive_kernel(const T* __restrict__ d_a, const T* __restrict__ d_b,
                        float* __restrict__ d_c, int64_t m, int64_t n, int64_t k,
                        int64_t tiles_m) {
  const TileCoord tile = matmul::PlainTile(tiles_m);
  const int64_t row = tile.m * kTile + threadIdx.x;  // threadIdx.x walks rows: uncoalesced
  const int64_t col = tile.n * kTile + threadIdx.y;
  if (row >= m || col >= n) return;
  const T* a_row = d_a + row * k;
  float acc = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    acc += matmul::ToFloat(a_row[i]) * matmul::ToFloat(d_b[i * n + col]);
  }
  d_c[row * n + col] = acc;
}

template <typename T>
cudaError_t Launch(const T* d_a, const T* d_b, float* d_c, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const int64_t tiles = matmul::TileCount(m, n, kTile, kTile);
  if (tiles == 0) return cudaErrorInvalidValue;
  matmul_naive_kernel<<<static_cast<unsigned>(tiles), dim3(kTile, kTile), 0, stream>>>(
      d_a, d_b, d_c, m, n, k, CeilDiv<int64_t>(m, kTile));
  return LastLaunchError();
}

}  // namespace

cudaError_t MatmulNaive(const float* d_a, const float* d_b, float* d_c, int64_t m, int64_t n,
                        int64_t k, cudaStream_t stream) {
  return Launch(d_a, d_b, d_c, m, n, k, stream);
}

cudaError_t MatmulNaive(const bf16_bits* d_a, const bf16_bits* d_b, float* d_c, int64_t m,
                        int64_t n, int64_t k, cudaStream_t stream) {
  return Launch(matmul::AsDevice(d_a), matmul::AsDevice(d_b), d_c, m, n, k, stream);
}

}  // namespace opserve::kernels
