// vectorized: the bandwidth one. One launch: a persistent grid of exactly one full wave
// (kBlocksPerSm blocks on every SM) streams the input as 16-byte vectors (float4 / int4 /
// longlong2, or 8 bf16 in a uint4, through the read-only path: reduce_common.cuh's Vec16),
// kUnroll independent vector loads in flight per thread; each block writes one partial, and the
// last block to finish (a device-scope completion counter) reduces the partials in a fixed order
// and writes the result.
//
// The counter needs no memset node: each stream that calls this gets its own slot of a
// `__device__` array (zero at module load), and the last block's atomicInc wraps the slot back to
// 0, so it is zero again for the stream's next launch, which stream order puts after this one.
// Slots are keyed by the stream's context-unique ID (cudaStreamGetId, never reused, unlike a
// destroyed stream's address), so launches on different streams never share a counter. Launches
// that cannot be keyed that way (the default streams, whose meaning depends on the caller's
// compile flags and thread; a stream being captured into a graph, which may be replayed
// concurrently; more than kCounterSlots streams) use a counter in the caller's scratch zeroed by a
// 4-byte memset. Why: on a small input the memset node is a second serial device operation in a
// sum of a few microseconds (docs/performance/sum.md). The slots are per operator: each op's .cu
// file that includes this has its own array.
//
// Work mapping (grid-wide strip mining, as CUB's reduce agent does per tile): round r, slot u of
// thread g reads vector (r * kUnroll + u) * total_threads + g, so every warp load is one coalesced
// 512-byte segment. The last, partial round is spread over all threads (each gets at most kUnroll
// guarded vectors), so no block carries a whole extra tile and the wave drains evenly. The scalars
// before the first 16-byte boundary and after the last full vector (fewer than one vector's lanes
// each) go to block 0.
//
// Why the last block finishes instead of a second launch: on large inputs it saves the launch
// gap; on small ones the fence, the counter's atomic and the last block's read of the partials
// cost about what the gap does (docs/performance/sum.md).
//
// Deterministic: the grid is a function of n and the SM count only, each thread and block adds in
// a fixed order, and the last block (whichever it is) combines the partials in the order of their
// index. Float accuracy of a sum: each round's lanes * kUnroll values are summed as a tree before
// one add into the running sum, so the serial chain is about
// n / (lanes * kUnroll * total_threads) adds
// (~250 at n = 2^30 floats on 132 SMs; half that for bf16, whose 8 lanes a vector are added in
// float).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/reduce.h"
#include "kernels/reduce_common.cuh"

namespace opserve::kernels {
namespace vectorized {
// Internal linkage: each op's .cu file that includes this has its own copy (and counter slots).
namespace {

using reduce::AccT;
using reduce::Combine;
using reduce::kLanes;
using reduce::ReduceLanes;
using reduce::Vec16T;

constexpr int kThreads = 256;
// 4 blocks x 256 threads x 8 vectors x 16 B = 128 KiB of loads in flight per SM, several times
// what Little's law asks at ~3-4.8 TB/s (about 20-30 KiB per SM); the register budget this allows
// (64 per thread) holds the 32 registers of vector data without spilling.
constexpr int kBlocksPerSm = 4;
constexpr int kUnroll = 8;
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(kThreads * kBlocksPerSm <= 2048, "one wave must fit the SM's thread slots");
static_assert(kUnroll >= 1 && (kUnroll & (kUnroll - 1)) == 0, "pairwise combine needs 2^k");


// Pairwise combine of s[0..kUnroll) (fixed shape).
template <typename Op, typename Acc>
__device__ __forceinline__ Acc Tree(Acc (&s)[kUnroll]) {
#pragma unroll
  for (int width = kUnroll / 2; width > 0; width /= 2) {
#pragma unroll
    for (int u = 0; u < width; ++u) s[u] = Combine<Op>(s[u], s[u + width]);
  }
  return s[0];
}

// `head` scalars precede the first 16-byte boundary (0 for a cudaMalloc pointer); the vectors
// start at in + head and there are (n - head) / kLanes of them; the rest is a scalar tail.
// With one block, `out` gets the block's result directly (partials and blocks_done are unused).
template <typename Op, typename T, typename Out>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    reduce_vectorized_kernel(const T* __restrict__ in, int64_t n, int head,
                             AccT<Op, T>* __restrict__ partials, unsigned int* blocks_done,
                             Out* __restrict__ out) {
  using Acc = AccT<Op, T>;
  using V = Vec16T<T>;
  constexpr int kL = kLanes<T>;
  const V* __restrict__ vin = reinterpret_cast<const V*>(in + head);
  const int64_t n_vec = (n - head) / kL;
  const int64_t total_threads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t round_vecs = total_threads * kUnroll;
  const int64_t full_rounds = n_vec / round_vecs;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;

  Acc acc = reduce::Identity<Op, Acc>();
  const V* p = vin + g;
  // Bounded by a pointer, not a round counter: the int64 instantiation spills at the 64-register
  // cap with a 64-bit counter beside its 32 registers of loads (ptxas -v).
  const V* const p_end = p + full_rounds * round_vecs;
  for (; p != p_end; p += round_vecs) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(p + u * total_threads);
    Acc s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) s[u] = ReduceLanes<Op, T>(v[u]);
    acc = Combine<Op>(acc, Tree<Op>(s));
  }
  {  // The partial last round: fewer than round_vecs vectors, at most kUnroll per thread.
    const int64_t base = full_rounds * round_vecs + g;
    Acc s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = base + u * total_threads;
      s[u] = idx < n_vec ? ReduceLanes<Op, T>(__ldg(vin + idx)) : reduce::Identity<Op, Acc>();
    }
    acc = Combine<Op>(acc, Tree<Op>(s));
  }
  acc = Combine<Op>(acc, reduce::HeadTailTerm<Op>(in, n, head, n_vec));
  acc = reduce::BlockReduce<Op, kThreads>(acc);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) *out = reduce::ToOut<Out>(acc);
    return;
  }
  __shared__ bool is_last;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = acc;
    __threadfence();  // the partial is visible device-wide before this block counts as done
    // Counts 0, 1, ..., gridDim.x - 1, and the last block's increment wraps it to 0: the counter
    // is zero again when the kernel ends, ready for the slot's next launch.
    is_last = atomicInc(blocks_done, gridDim.x - 1) == gridDim.x - 1;
  }
  // Also orders BlockReduce's shared reads above before the second call below rewrites them.
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // pairs with the other blocks' fences: every partial is visible now
  // Fixed order: thread t combines partials t, t + kThreads, ...; then the block tree. Volatile
  // loads, so no stale L1 line can stand in for another SM's write.
  const volatile Acc* p_all = partials;
  Acc total = reduce::Identity<Op, Acc>();
  for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += kThreads) {
    total = Combine<Op>(total, p_all[i]);
  }
  total = reduce::BlockReduce<Op, kThreads>(total);
  if (threadIdx.x == 0) *out = reduce::ToOut<Out>(total);
}

// Completion counters without a memset (see the top of the file): one slot per stream.
constexpr int kCounterSlots = 256;
__device__ unsigned int g_blocks_done[kCounterSlots];

// This stream's counter slot on the current device, or nullptr when the launch must bring its own
// zeroed counter. Thread-safe (the server has a worker per device; tests may add threads).
cudaError_t StreamCounter(cudaStream_t stream, unsigned int** counter) {
  *counter = nullptr;
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return cudaSuccess;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return err;
  if (capture != cudaStreamCaptureStatusNone) return cudaSuccess;
  unsigned long long stream_id = 0;
  err = cudaStreamGetId(stream, &stream_id);
  if (err != cudaSuccess) return err;
  int device = 0;
  err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;

  // Looked up on every call, not cached: a cudaDeviceReset by the process would move it.
  void* base = nullptr;
  err = cudaGetSymbolAddress(&base, g_blocks_done);
  if (err != cudaSuccess) return err;

  static std::mutex mu;
  static std::map<std::pair<int, unsigned long long>, int> slot_of;  // (device, stream ID) -> slot
  static std::map<int, int> used;                                     // device -> slots given out
  int slot = -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = slot_of.find({device, stream_id});
    if (it != slot_of.end()) {
      slot = it->second;
    } else if (used[device] < kCounterSlots) {
      slot = used[device]++;
      slot_of.emplace(std::make_pair(device, stream_id), slot);
    }
  }
  if (slot >= 0) *counter = static_cast<unsigned int*>(base) + slot;  // else: the memset path
  return cudaSuccess;
}

template <typename Op, typename T, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                 cudaStream_t stream) {
  using Acc = AccT<Op, T>;
  constexpr int kL = kLanes<T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  int head = 0;
  cudaError_t err = reduce::VectorHead(d_in, n, &head);
  if (err != cudaSuccess) return err;
  const int64_t n_vec = (n - head) / kL;

  int sm_count = 0;
  err = reduce::CurrentDeviceSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const int grid =
      reduce::FirstPassGrid(n_vec, int64_t{kThreads} * kUnroll, sm_count, kBlocksPerSm);
  // Scratch: the partials, then the completion counter (16-byte aligned).
  const size_t partial_bytes = (static_cast<size_t>(grid) * sizeof(Acc) + 15) / 16 * 16;
  const size_t need = partial_bytes + sizeof(unsigned int);
  if (d_temp == nullptr) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) return cudaErrorInvalidValue;

  Acc* d_partials = static_cast<Acc*>(d_temp);
  unsigned int* d_done = nullptr;
  if (grid > 1) {  // one block needs no counter: its result is the answer
    err = StreamCounter(stream, &d_done);
    if (err != cudaSuccess) return err;
    if (d_done == nullptr) {
      d_done = reinterpret_cast<unsigned int*>(static_cast<char*>(d_temp) + partial_bytes);
      err = cudaMemsetAsync(d_done, 0, sizeof(unsigned int), stream);
      if (err != cudaSuccess) return err;
    }
  }
  reduce_vectorized_kernel<Op, T, Out>
      <<<grid, kThreads, 0, stream>>>(d_in, n, head, d_partials, d_done, d_out);
  return LastLaunchError();
}

}  // namespace
}  // namespace vectorized

OPSERVE_DEFINE_REDUCE_ALL(ReduceVectorized, vectorized::Impl)

}  // namespace opserve::kernels
