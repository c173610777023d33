// chunked: one 256-thread block per contiguous 16 KiB chunk (4 independent 16-byte loads per
// thread, whatever the element type: 4096 float or int32 elements, 2048 int64, 8192 bf16), a
// grid of as many blocks as chunks, and a two-level finish by the last blocks to end.
//
// Why a chunk per block (docs/performance/sum.md, "chunked"): consecutive blocks that each read one
// contiguous 16 KiB piece read memory faster than a grid-stride loop (CUB's DeviceReduce,
// sum_vectorized) or a persistent grid walking 16 KiB pieces: each block's loads stay inside a
// few DRAM pages and the blocks sweep memory in dispatch order.
//
// The finish, without a second launch: blocks are grouped kGroup at a time. Each block writes its
// partial and counts itself done in its group; the group's last block adds the group's partials
// in index order and counts the group done; the last group adds the group totals in index order
// ("adds": combines, under the launcher's operator).
// The counters (one per group, one for the groups) live in the caller's scratch and are zeroed by
// one cudaMemsetAsync per launch: a few microseconds, small against the multi-GiB sums this
// algorithm is for.
//
// Deterministic: the chunking is a function of n and of the input's offset from a 16-byte boundary
// (the scalar head), each thread and each block add in a fixed order, and both finishing levels
// add in index order, whichever block happens to run them.
// Inputs past kMaxGrid chunks (over 16 GiB) loop: block b takes chunks b, b + grid, ...
#pragma once

#include <cstdint>

#include "kernels/reduce.h"
#include "kernels/reduce_common.cuh"

namespace opserve::kernels {
namespace chunked {
// Internal linkage: each op's .cu file that includes this has its own copy.
namespace {

using reduce::AccT;
using reduce::Combine;
using reduce::kLanes;
using reduce::ReduceLanes;
using reduce::Vec16T;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 256 threads x 4 x 16 B = one 16 KiB chunk per block
constexpr int64_t kChunkVecs = int64_t{kThreads} * kUnroll;
constexpr int kGroup = 1024;                             // blocks per first-level group
constexpr int64_t kMaxGrid = int64_t{kGroup} * kGroup;  // the second level is one group too
static_assert(kMaxGrid <= 0x7fffffff, "gridDim.x limit");

// Combines vals[0..count) in a fixed order (thread t: t, t + kThreads, ..., then the block
// tree); the result is valid in thread 0. Volatile loads: another SM wrote these values.
template <typename Op, typename Acc>
__device__ __forceinline__ Acc ReduceInOrder(const Acc* vals, int64_t count) {
  const volatile Acc* v = vals;
  Acc total = reduce::Identity<Op, Acc>();
  for (int64_t i = threadIdx.x; i < count; i += kThreads) total = Combine<Op>(total, v[i]);
  return reduce::BlockReduce<Op, kThreads>(total);
}

// Thread 0 publishes `value` at slot[index] and counts itself done on `counter` out of `members`;
// returns, in every thread of the block, whether this block was the last of them.
template <typename Acc>
__device__ __forceinline__ bool PublishAndCount(Acc value, Acc* slot, unsigned int* counter,
                                                unsigned int members, bool* is_last) {
  if (threadIdx.x == 0) {
    *slot = value;
    __threadfence();  // the value is visible device-wide before this block counts as done
    const bool last = atomicAdd(counter, 1u) == members - 1;
    if (last) __threadfence();  // pairs with the other blocks' fences, before anyone reads
    *is_last = last;
  }
  __syncthreads();  // publishes is_last; also orders BlockReduce's shared reads before reuse
  return *is_last;
}

// `head` scalars precede the first 16-byte boundary; the vectors follow; then a scalar tail.
template <typename Op, typename T, typename Out>
__global__ void __launch_bounds__(kThreads)
    reduce_chunked_kernel(const T* __restrict__ in, int64_t n, int head, AccT<Op, T>* partials,
                          AccT<Op, T>* group_totals, unsigned int* counters,
                          Out* __restrict__ out) {
  using Acc = AccT<Op, T>;
  using V = Vec16T<T>;
  const V* __restrict__ vin = reinterpret_cast<const V*>(in + head);
  const int64_t n_vec = (n - head) / kLanes<T>;
  const int64_t chunks = (n_vec + kChunkVecs - 1) / kChunkVecs;

  Acc acc = reduce::Identity<Op, Acc>();
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t base = c * kChunkVecs + threadIdx.x;
    Acc s[kUnroll];
    if (base + (kUnroll - 1) * kThreads < n_vec) {
      V v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(vin + base + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) s[u] = ReduceLanes<Op, T>(v[u]);
    } else {  // the last, partial chunk
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads;
        s[u] = i < n_vec ? ReduceLanes<Op, T>(__ldg(vin + i)) : reduce::Identity<Op, Acc>();
      }
    }
    acc = Combine<Op>(acc, Combine<Op>(Combine<Op>(s[0], s[1]), Combine<Op>(s[2], s[3])));
  }
  static_assert(kUnroll == 4, "the pairwise combine above is written for 4");
  acc = Combine<Op>(acc, reduce::HeadTailTerm<Op>(in, n, head, n_vec));
  acc = reduce::BlockReduce<Op, kThreads>(acc);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) *out = reduce::ToOut<Out>(acc);
    return;
  }
  __shared__ bool is_last;
  const unsigned int grid = gridDim.x;
  const unsigned int groups = (grid + kGroup - 1) / kGroup;
  const unsigned int g = blockIdx.x / kGroup;
  const unsigned int members = g + 1 < groups ? kGroup : grid - g * kGroup;
  if (!PublishAndCount(acc, &partials[blockIdx.x], &counters[g], members, &is_last)) return;
  Acc total = ReduceInOrder<Op>(partials + static_cast<int64_t>(g) * kGroup, members);
  if (groups == 1) {
    if (threadIdx.x == 0) *out = reduce::ToOut<Out>(total);
    return;
  }
  if (!PublishAndCount(total, &group_totals[g], &counters[groups], groups, &is_last)) return;
  total = ReduceInOrder<Op>(group_totals, groups);
  if (threadIdx.x == 0) *out = reduce::ToOut<Out>(total);
}

template <typename Op, typename T, typename Out>
cudaError_t Impl(void* d_temp, size_t* temp_bytes, const T* d_in, Out* d_out, int64_t n,
                 cudaStream_t stream) {
  using Acc = AccT<Op, T>;
  if (temp_bytes == nullptr || n < 0) return cudaErrorInvalidValue;
  int head = 0;
  if (cudaError_t err = reduce::VectorHead(d_in, n, &head); err != cudaSuccess) return err;
  const int64_t chunks = CeilDiv<int64_t>((n - head) / kLanes<T>, kChunkVecs);
  const int64_t grid64 = chunks < 1 ? 1 : (chunks < kMaxGrid ? chunks : kMaxGrid);
  const unsigned int grid = static_cast<unsigned int>(grid64);
  const unsigned int groups = static_cast<unsigned int>(CeilDiv<int64_t>(grid64, kGroup));
  // Scratch: partials, group totals, then groups + 1 counters; each part 16-byte aligned.
  auto align16 = [](size_t b) { return (b + 15) / 16 * 16; };
  const size_t partial_bytes = align16(grid64 * sizeof(Acc));
  const size_t group_bytes = align16(groups * sizeof(Acc));
  const size_t counter_bytes = (groups + 1) * sizeof(unsigned int);
  // At least one byte, as CUB reports: a caller may treat 0 as "no scratch, query again".
  const size_t need = grid > 1 ? partial_bytes + group_bytes + counter_bytes : 1;
  if (d_temp == nullptr) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) return cudaErrorInvalidValue;

  char* scratch = static_cast<char*>(d_temp);
  Acc* partials = grid > 1 ? reinterpret_cast<Acc*>(scratch) : nullptr;
  Acc* group_totals = grid > 1 ? reinterpret_cast<Acc*>(scratch + partial_bytes) : nullptr;
  unsigned int* counters =
      grid > 1 ? reinterpret_cast<unsigned int*>(scratch + partial_bytes + group_bytes) : nullptr;
  if (grid > 1) {
    cudaError_t err = cudaMemsetAsync(counters, 0, counter_bytes, stream);
    if (err != cudaSuccess) return err;
  }
  reduce_chunked_kernel<Op, T, Out><<<grid, kThreads, 0, stream>>>(
      d_in, n, head, partials, group_totals, counters, d_out);
  return LastLaunchError();
}

}  // namespace
}  // namespace chunked

OPSERVE_DEFINE_REDUCE_ALL(ReduceChunked, chunked::Impl)

}  // namespace opserve::kernels
