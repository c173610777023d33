// sum, vectorized: the bandwidth one. One launch: a persistent grid of exactly one full wave
// (kBlocksPerSm blocks on every SM) streams the input as 16-byte vectors (float4 / int4 /
// longlong2, or 8 bf16 in a uint4, through the read-only path: sum_common.cuh's SumVec), kUnroll
// independent vector loads in flight per thread; each block writes one
// partial, and the last block to finish (a device-scope completion counter) sums the partials in
// a fixed order and writes the result.
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
// sum of a few microseconds (docs/performance/sum.md).
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
// a fixed order, and the last block (whichever it is) adds the partials in the order of their
// index. Float accuracy: each round's lanes * kUnroll values are summed as a tree before one add
// into the running sum, so the serial chain is about n / (lanes * kUnroll * total_threads) adds
// (~250 at n = 2^30 floats on 132 SMs; half that for bf16, whose 8 lanes a vector are added in
// float).
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/sum.h"
#include "kernels/sum_common.cuh"

namespace opserve::kernels {
namespace {

using sum_internal::kLanes;
using sum_internal::SumAccumT;
using sum_internal::SumLanes;
using sum_internal::SumVecT;

constexpr int kThreads = 256;
// 4 blocks x 256 threads x 8 vectors x 16 B = 128 KiB of loads in flight per SM, several times
// what Little's law asks at ~3-4.8 TB/s (about 20-30 KiB per SM); the register budget this allows
// (64 per thread) holds the 32 registers of vector data without spilling.
constexpr int kBlocksPerSm = 4;
constexpr int kUnroll = 8;
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(kThreads * kBlocksPerSm <= 2048, "one wave must fit the SM's thread slots");
static_assert(kUnroll >= 1 && (kUnroll & (kUnroll - 1)) == 0, "pairwise combine needs 2^k");


// Pairwise sum of s[0..kUnroll) (fixed shape).
template <typename Acc>
__device__ __forceinline__ Acc TreeSum(Acc (&s)[kUnroll]) {
#pragma unroll
  for (int width = kUnroll / 2; width > 0; width /= 2) {
#pragma unroll
    for (int u = 0; u < width; ++u) s[u] += s[u + width];
  }
  return s[0];
}

// `head` scalars precede the first 16-byte boundary (0 for a cudaMalloc pointer); the vectors
// start at in + head and there are (n - head) / kLanes of them; the rest is a scalar tail.
// With one block, `out` gets the block's sum directly (partials and blocks_done are unused).
template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    sum_vectorized_kernel(const T* __restrict__ in, int64_t n, int head,
                          SumAccumT<T>* __restrict__ partials, unsigned int* blocks_done,
                          SumAccumT<T>* __restrict__ out) {
  using Acc = SumAccumT<T>;
  using V = SumVecT<T>;
  constexpr int kL = kLanes<T>;
  const V* __restrict__ vin = reinterpret_cast<const V*>(in + head);
  const int64_t n_vec = (n - head) / kL;
  const int64_t total_threads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t round_vecs = total_threads * kUnroll;
  const int64_t full_rounds = n_vec / round_vecs;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;

  Acc acc = Acc(0);
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
    for (int u = 0; u < kUnroll; ++u) s[u] = SumLanes<T>(v[u]);
    acc += TreeSum(s);
  }
  {  // The partial last round: fewer than round_vecs vectors, at most kUnroll per thread.
    const int64_t base = full_rounds * round_vecs + g;
    Acc s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = base + u * total_threads;
      s[u] = idx < n_vec ? SumLanes<T>(__ldg(vin + idx)) : Acc(0);
    }
    acc += TreeSum(s);
  }
  acc += sum_internal::HeadTailTerm(in, n, head, n_vec);
  acc = sum_internal::BlockReduceSum<kThreads>(acc);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) *out = acc;
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
  // Also orders BlockReduceSum's shared reads above before the second call below rewrites them.
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // pairs with the other blocks' fences: every partial is visible now
  // Fixed order: thread t adds partials t, t + kThreads, ...; then the block tree. Volatile
  // loads, so no stale L1 line can stand in for another SM's write.
  const volatile Acc* p_all = partials;
  Acc total = Acc(0);
  for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += kThreads) total += p_all[i];
  total = sum_internal::BlockReduceSum<kThreads>(total);
  if (threadIdx.x == 0) *out = total;
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

template <typename T>
cudaError_t SumVectorizedImpl(void* d_temp, size_t* temp_bytes, const T* d_in,
                              SumAccumT<T>* d_out, int64_t n, cudaStream_t stream) {
  using Acc = SumAccumT<T>;
  constexpr int kL = kLanes<T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  int head = 0;
  cudaError_t err = sum_internal::VectorHead(d_in, n, &head);
  if (err != cudaSuccess) return err;
  const int64_t n_vec = (n - head) / kL;

  int sm_count = 0;
  err = sum_internal::CurrentDeviceSmCount(&sm_count);
  if (err != cudaSuccess) return err;
  const int grid =
      sum_internal::FirstPassGrid(n_vec, int64_t{kThreads} * kUnroll, sm_count, kBlocksPerSm);
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
  if (grid > 1) {  // one block needs no counter: its sum is the answer
    err = StreamCounter(stream, &d_done);
    if (err != cudaSuccess) return err;
    if (d_done == nullptr) {
      d_done = reinterpret_cast<unsigned int*>(static_cast<char*>(d_temp) + partial_bytes);
      err = cudaMemsetAsync(d_done, 0, sizeof(unsigned int), stream);
      if (err != cudaSuccess) return err;
    }
  }
  sum_vectorized_kernel<T><<<grid, kThreads, 0, stream>>>(d_in, n, head, d_partials, d_done, d_out);
  return LastLaunchError();
}

}  // namespace

OPSERVE_DEFINE_SUM_OVERLOADS_ALL_DTYPES(SumVectorized, SumVectorizedImpl)

}  // namespace opserve::kernels
