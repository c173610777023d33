// Private helpers shared by the matmul kernels (kernels/matmul_*.cu). Not a public header.
//
// Conventions of every matmul launcher here:
//   - C[M,N] = A[M,K] x B[K,N], all row-major, C in float32.
//   - The bf16 overloads reinterpret the raw bits as __nv_bfloat16; the CUDA-core kernels convert
//     each element to float as it is loaded and accumulate in float.
//   - Grids are 1-D over output tiles (blockIdx.x -> (tile_m, tile_n)), so neither M nor N is
//     bounded by gridDim.y <= 65535.
//   - Offsets that multiply a row index by a row stride are int64 (M*K and K*N can pass 2^31).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/common.h"

namespace opserve::kernels::matmul {

// The device-side element type behind each launcher's input type.
template <typename T>
struct DeviceElem;
template <>
struct DeviceElem<float> {
  using type = float;
};
template <>
struct DeviceElem<bf16_bits> {
  using type = __nv_bfloat16;
};
template <typename T>
using DeviceElemT = typename DeviceElem<T>::type;

template <typename T>
inline const DeviceElemT<T>* AsDevice(const T* p) {
  return reinterpret_cast<const DeviceElemT<T>*>(p);
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// Four consecutive elements as a float4 in one vector load: 16 bytes of float, 8 bytes of bf16.
// The caller guarantees the alignment (4 * sizeof(T) bytes).
__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 Load4(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Four consecutive elements, each guarded by its own bound (zero past `limit`): the path for
// row strides that are not a multiple of the vector width or for misaligned bases.
template <typename T>
__device__ __forceinline__ float4 Load4Guarded(const T* p, int64_t first, int64_t limit) {
  float4 v;
  v.x = first + 0 < limit ? ToFloat(p[0]) : 0.0f;
  v.y = first + 1 < limit ? ToFloat(p[1]) : 0.0f;
  v.z = first + 2 < limit ? ToFloat(p[2]) : 0.0f;
  v.w = first + 3 < limit ? ToFloat(p[3]) : 0.0f;
  return v;
}

inline bool IsAligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Number of output tiles for a 1-D grid, or 0 when the grid would exceed gridDim.x's limit.
inline int64_t TileCount(int64_t m, int64_t n, int64_t tile_m, int64_t tile_n) {
  const int64_t tiles = CeilDiv(m, tile_m) * CeilDiv(n, tile_n);
  return tiles <= INT_MAX ? tiles : 0;
}

// The launch prologue of the 1-D tile grids (every launcher here but sm90a, which refuses the
// shapes it does not take before this point): an empty C launches nothing; otherwise
// launch(blocks, tiles_m, tiles_n) runs with one block per tile_m x tile_n tile of C, or the
// result is cudaErrorInvalidValue when that many blocks would pass gridDim.x's limit.
template <typename Launch>
cudaError_t WithTileGrid(int64_t m, int64_t n, int64_t tile_m, int64_t tile_n, Launch launch) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const int64_t tiles = TileCount(m, n, tile_m, tile_n);
  if (tiles == 0) return cudaErrorInvalidValue;
  return launch(static_cast<unsigned>(tiles), CeilDiv<int64_t>(m, tile_m),
                CeilDiv<int64_t>(n, tile_n));
}

// The whole launch of the CUDA-core kernels that take no dynamic shared memory and walk the
// tiles in PlainTile order: `kernel` is (a, b, c, m, n, k, tiles_m). Their files define their
// public overloads with OPSERVE_DEFINE_MATMUL_TILES (below).
template <typename Kernel, typename T>
cudaError_t LaunchTiles(Kernel kernel, int64_t tile_m, int64_t tile_n, dim3 block, const T* d_a,
                        const T* d_b, float* d_c, int64_t m, int64_t n, int64_t k,
                        cudaStream_t stream) {
  return WithTileGrid(m, n, tile_m, tile_n, [&](unsigned blocks, int64_t tiles_m, int64_t) {
    kernel<<<blocks, block, 0, stream>>>(d_a, d_b, d_c, m, n, k, tiles_m);
    return LastLaunchError();
  });
}

struct TileCoord {
  int64_t m;
  int64_t n;
};

// Plain column-of-tiles order: consecutive blocks walk down M within one N column of tiles.
__device__ __forceinline__ TileCoord PlainTile(int64_t tiles_m) {
  const int64_t pid = blockIdx.x;
  return {pid % tiles_m, pid / tiles_m};
}

// Grouped order (as Triton's matmul tutorial): blocks that run together cover a
// group_m x (a few) patch of C, so they share A row-panels and B column-panels in L2.
// `pid` is the tile's place in that order (a persistent kernel's loop index).
__device__ __forceinline__ TileCoord GroupedTile(int64_t pid, int64_t tiles_m, int64_t tiles_n,
                                                 int64_t group_m) {
  const int64_t per_group = group_m * tiles_n;
  const int64_t group = pid / per_group;
  const int64_t first_m = group * group_m;
  const int64_t rows_in_group = tiles_m - first_m < group_m ? tiles_m - first_m : group_m;
  const int64_t in_group = pid - group * per_group;
  return {first_m + in_group % rows_in_group, in_group / rows_in_group};
}
// The same for a kernel with one block per tile.
__device__ __forceinline__ TileCoord GroupedTile(int64_t tiles_m, int64_t tiles_n,
                                                 int64_t group_m) {
  return GroupedTile(blockIdx.x, tiles_m, tiles_n, group_m);
}

}  // namespace opserve::kernels::matmul

// Defines both public overloads of kernels/matmul.h's `Name` (float, and bf16 as raw bits) by
// forwarding to `Launch`, the file's template over the device element type: the definitions that
// match OPSERVE_DECLARE_MATMUL. Use inside namespace opserve::kernels.
#define OPSERVE_DEFINE_MATMUL(Name, Launch)                                                   \
  cudaError_t Name(const float* d_a, const float* d_b, float* d_c, int64_t m, int64_t n,     \
                   int64_t k, cudaStream_t stream) {                                          \
    return Launch(d_a, d_b, d_c, m, n, k, stream);                                            \
  }                                                                                           \
  cudaError_t Name(const bf16_bits* d_a, const bf16_bits* d_b, float* d_c, int64_t m,        \
                   int64_t n, int64_t k, cudaStream_t stream) {                               \
    return Launch(matmul::AsDevice(d_a), matmul::AsDevice(d_b), d_c, m, n, k, stream);       \
  }

// The same for a kernel template launched by LaunchTiles: `kernel` names the file's kernel
// template (instantiated for float and for __nv_bfloat16); a block of `block` threads per
// tile_m x tile_n tile of C.
#define OPSERVE_DEFINE_MATMUL_TILES(Name, kernel, tile_m, tile_n, block)                      \
  cudaError_t Name(const float* d_a, const float* d_b, float* d_c, int64_t m, int64_t n,     \
                   int64_t k, cudaStream_t stream) {                                          \
    return matmul::LaunchTiles(kernel<float>, tile_m, tile_n, block, d_a, d_b, d_c, m, n, k,  \
                               stream);                                                       \
  }                                                                                           \
  cudaError_t Name(const bf16_bits* d_a, const bf16_bits* d_b, float* d_c, int64_t m,        \
                   int64_t n, int64_t k, cudaStream_t stream) {                               \
    return matmul::LaunchTiles(kernel<matmul::DeviceElemT<bf16_bits>>, tile_m, tile_n, block, \
                               matmul::AsDevice(d_a), matmul::AsDevice(d_b), d_c, m, n, k,    \
                               stream);                                                       \
  }
