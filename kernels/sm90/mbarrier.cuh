// Hopper (sm_90) mbarrier primitives, shared by the TMA kernels (transpose_tma.cu,
// matmul_tensor_core_sm90a.cu). One thin, always-inlined function per PTX instruction, in the
// manner of CCCL's cuda::ptx wrappers: the instruction, its state space and its memory clobber are
// written here once. Device code only.
//
// An mbarrier is a 64-bit object in shared memory with a phase bit, a pending-arrival count and a
// transaction (byte) count (PTX ISA, "Parallel Synchronization and Communication Instructions:
// mbarrier"). A phase completes when both counts reach zero; the barrier then re-arms with its
// initial arrival count and flips its phase parity. The kernels here use pairs of them as a ring:
// "full" (the producer's arrival + TMA's bytes) and "empty" (every consumer's arrival).
//
// Every function takes the barrier's 32-bit shared-window address (what `.shared::cta` operands
// are); the pointer overloads convert a generic pointer with SmemAddr first, for callers that keep
// their barriers as uint64_t*. Every asm carries a "memory" clobber: each instruction orders
// shared-memory traffic around it, so the compiler must not move loads or stores across it.
#pragma once

#include <cstdint>

namespace opserve::kernels::sm90 {

// The shared-window address of a generic pointer into shared memory (cvta.to.shared; PTX ISA
// "Data Movement and Conversion Instructions: cvta", "Generic Addressing"). A `.shared::cta`
// address is also a valid `.shared::cluster` address of the executing CTA ("State Spaces: Shared
// State Space"), which is how the TMA destination operand below takes it.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier.init (PTX ISA "mbarrier.init"): sets the barrier to phase 0 expecting `count`
// arrivals per phase and no pending transactions. One thread initialises; see FenceMbarInit.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init.release.cluster (PTX ISA "Parallel Synchronization and Communication
// Instructions: membar/fence"): a light-weight release fence over this thread's prior
// mbarrier.init only. Without it the async proxy (TMA's complete_tx) may see the barrier's
// memory before the init; the other threads of the CTA still need the __syncthreads that follows.
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// mbarrier.arrive.expect_tx (PTX ISA "mbarrier.expect_tx", "mbarrier.arrive"): raises the current
// phase's transaction count by `bytes`, then arrives once. The phase cannot complete until the
// bulk copies that name this barrier have delivered that many bytes ("Tracking asynchronous
// operations by the mbarrier object"); expecting and arriving in one instruction means the
// producer's arrival never lands while the phase still expects no bytes, which would let it
// complete before the copies.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// mbarrier.arrive (PTX ISA "mbarrier.arrive"): one arrival, with release semantics at CTA scope
// (the default .release.cta): this thread's earlier shared-memory reads and writes are done
// before the arrival counts. The state result is discarded (`_`): waits here go by parity.
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Spins on mbarrier.try_wait.parity (PTX ISA "mbarrier.test_wait/mbarrier.try_wait") until the
// phase of parity `parity` has completed. Acquire semantics at CTA scope (the default): the
// completed phase's writes, TMA's included, are visible afterwards. try_wait, unlike test_wait,
// may suspend the thread for a time-limit the hardware picks, so the loop does not hammer the
// barrier. A freshly initialised barrier is in phase 0, and its "previous" phase (parity 1)
// counts as complete ("Phase Completion of the mbarrier object"): waiting on parity 1 returns at
// once, which is how a producer's first pass over a ring's empty stages goes through.
__device__ __forceinline__ void MbarWaitParity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// The same, on barriers held as generic pointers into shared memory.
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  MbarInit(SmemAddr(bar), count);
}
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  MbarArriveExpectTx(SmemAddr(bar), bytes);
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) { MbarArrive(SmemAddr(bar)); }
__device__ __forceinline__ void MbarWaitParity(uint64_t* bar, uint32_t parity) {
  MbarWaitParity(SmemAddr(bar), parity);
}

}  // namespace opserve::kernels::sm90
