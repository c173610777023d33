// Private helpers shared by the row_reduce_*.cu launchers (row_sum / row_mean over FLOAT32
// [rows, cols]). Not part of the kernel layer's public surface.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.h"

namespace opserve::kernels::row_reduce {

constexpr int kWarpSize = 32;

// Host: what each output is multiplied by. A sum is left exact (x * 1.0f == x); a mean uses
// 1/cols rounded once from double, so one rounding step more than a division, far under any
// float32 tolerance, and a multiply instead of a divide per row.
inline float OutputScale(int64_t cols, bool mean) {
  return mean ? static_cast<float>(1.0 / static_cast<double>(cols)) : 1.0f;
}

// Host: multiprocessor count of the current device (grid sizing only).
inline cudaError_t CurrentSmCount(int* sm_count) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

// The one place where input is read, so a cache hint can be tried in one line. LDG through the
// read-only path, as CUB's LOAD_LDG does: every byte is read exactly once.
__device__ __forceinline__ float4 LoadStreaming(const float4* p) { return __ldg(p); }
__device__ __forceinline__ float LoadStreaming(const float* p) { return __ldg(p); }

__device__ __forceinline__ void AddTo(float4& acc, const float4& v) {
  acc.x += v.x;
  acc.y += v.y;
  acc.z += v.z;
  acc.w += v.w;
}

// Butterfly sum over aligned groups of kGroup lanes (a power of two <= 32). Every lane of the
// warp must call it (full mask); every lane of a group ends with the group's sum. The tree shape
// is fixed, so the result is deterministic.
template <int kGroup>
__device__ __forceinline__ float GroupSum(float v) {
  static_assert(kGroup >= 1 && kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0,
                "group must be a power of two within a warp");
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ __forceinline__ float WarpSum(float v) { return GroupSum<kWarpSize>(v); }

// Block-wide sum; the result is valid in thread 0 only. Ends with no barrier pending, but a caller
// that calls it again must __syncthreads() in between (warp_sums is reused).
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024");
  v = WarpSum(v);
  if constexpr (kThreads == kWarpSize) {
    return v;
  } else {
    constexpr int kWarps = kThreads / kWarpSize;
    __shared__ float warp_sums[kWarps];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = 0.0f;
    if (warp == 0) {
      v = lane < kWarps ? warp_sums[lane] : 0.0f;
      v = WarpSum(v);
    }
    return v;
  }
}

// This thread's share of the sum of p[0, n), for a team of kTeam threads in which this one is
// `rank` (0 <= rank < kTeam). Any alignment of p (it is a float*, so 4-byte aligned):
// a scalar head up to the first 16-byte boundary, then float4 loads, then a scalar tail.
// Body loads go kUnroll at a time, all issued before any is added, so a thread has up to
// kUnroll 16-byte loads in flight; the last partial round is predicated, not a scalar loop, so
// short ranges still issue their loads together. Accumulation: one float4 (four running sums)
// per thread, then the caller's tree, so each running sum sees n / (4 * kTeam) terms.
template <int kTeam, int kUnroll>
__device__ __forceinline__ float TeamPartialSum(const float* __restrict__ p, int64_t n, int rank) {
  static_assert(kTeam >= 1 && kUnroll >= 1, "team and unroll must be positive");
  const int misalign = static_cast<int>((reinterpret_cast<uintptr_t>(p) >> 2) & 3);  // floats
  const int64_t head = misalign == 0 ? 0 : (4 - misalign < n ? 4 - misalign : n);
  const int64_t body_vecs = (n - head) >> 2;
  const int64_t tail_begin = head + (body_vecs << 2);

  // Head and tail hold at most 3 elements each.
  float scalar = 0.0f;
  if constexpr (kTeam >= 3) {
    if (rank < head) scalar += LoadStreaming(p + rank);
    if (tail_begin + rank < n) scalar += LoadStreaming(p + tail_begin + rank);
  } else {
    for (int64_t k = rank; k < head; k += kTeam) scalar += LoadStreaming(p + k);
    for (int64_t k = tail_begin + rank; k < n; k += kTeam) scalar += LoadStreaming(p + k);
  }

  const float4* body = reinterpret_cast<const float4*>(p + head);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  int64_t i = rank;
  for (; i + static_cast<int64_t>(kUnroll - 1) * kTeam < body_vecs; i += kUnroll * kTeam) {
    float4 v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) v[j] = LoadStreaming(body + i + j * kTeam);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) AddTo(acc, v[j]);
  }
  {
    float4 v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t idx = i + j * kTeam;
      v[j] = idx < body_vecs ? LoadStreaming(body + idx) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) AddTo(acc, v[j]);
  }
  return ((acc.x + acc.y) + (acc.z + acc.w)) + scalar;
}

}  // namespace opserve::kernels::row_reduce
