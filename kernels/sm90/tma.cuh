// Hopper (sm_90) TMA: the bulk tensor copy from global to shared memory, shared by the TMA kernels
// (transpose_tma.cu, matmul_tensor_core_sm90a.cu). Device code only; the tensor maps it reads are
// encoded on the host (kernels/sm90/tensor_map.h).
#pragma once

#include <cuda.h>  // CUtensorMap: the type only

#include <cstdint>

#include "kernels/sm90/mbarrier.cuh"

namespace opserve::kernels::sm90 {

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes (PTX ISA "Data
// Movement and Conversion Instructions: cp.async.bulk.tensor"): the tensor memory accelerator
// copies the box of `map` whose first element is at (x = innermost coordinate, i.e. the column,
// y = row) into shared memory at `dst`, asynchronously; elements outside the tensor arrive as
// zeros. On completion it decrements `bar`'s transaction count by the box's bytes (the whole box,
// zero-filled part included), so a wait on `bar` (MbarWaitParity) is what makes the data
// visible; the caller has announced the bytes with MbarArriveExpectTx. One thread issues it.
// `dst` is a `.shared::cta` address of this CTA, valid in the `.shared::cluster` window the
// instruction names, 128-byte aligned (the kernels here align to 1024 bytes, the period of the
// 128-byte swizzle pattern). Coordinates are signed 32-bit, as the instruction takes them. The map
// must live in param, const or global memory (a __grid_constant__ kernel parameter here).
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int32_t x,
                                          int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// The same box written to the same shared-memory offset `dst` of every CTA of the cluster named
// in `cta_mask` (bit i: rank i), each CTA's mbarrier at offset `bar` receiving the box's bytes
// (.multicast::cluster). Each receiving CTA must have announced them with its own expect_tx.
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int32_t x,
                                                   int32_t y, uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(cta_mask)
      : "memory");
}

// The same, with the destination and the barrier as generic pointers into shared memory.
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, int32_t x, int32_t y,
                                          uint64_t* bar) {
  TmaLoad2d(SmemAddr(dst), map, x, y, SmemAddr(bar));
}

}  // namespace opserve::kernels::sm90
