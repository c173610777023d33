// Hopper (sm_90) thread-block clusters: the few PTX instructions the cluster kernels use
// (matmul_tensor_core_sm90a.cu). Device code only, one always-inlined function each.
#pragma once

#include <cstdint>

namespace opserve::kernels::sm90 {

// This CTA's rank in its cluster (%cluster_ctarank; PTX ISA "Special Registers").
__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster meets here (barrier.cluster.arrive / wait; PTX ISA
// "barrier.cluster"). Release on arrival, acquire on the wait: shared-memory writes before it
// (an mbarrier.init among them) are visible to the whole cluster after it. Not `.aligned`: the
// threads of a warp may reach it from different branches.
__device__ __forceinline__ void ClusterSync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n\t"
      "barrier.cluster.wait.acquire;" ::: "memory");
}

// One arrival on the mbarrier at shared address `bar` of CTA `cta` of this cluster (mapa turns
// this CTA's address into the peer's; PTX ISA "mapa", "mbarrier.arrive"). The default semantics,
// release at CTA scope, as CUTLASS's ClusterBarrier::arrive(cta_id) has them: what it orders are
// this thread's reads of a stage, done by then (the wgmmas that read it have completed). With an
// explicit .release.cluster instead, the GEMM ran 1.3-1.7x slower (measured; presumably the
// cluster-scope release waits for the consumer's wgmmas still in flight).
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

}  // namespace opserve::kernels::sm90
