// Device helpers of opserve-bench (bench_device.cu): random fills, the spin that keeps the GPU
// busy while the host queues a timed launch, and the error check of an output against its anchor.
// Plain C++ header; launchers take an explicit stream last and return cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace opserve::bench {

// Fresh random values from a counter hash of (seed, index): floats uniform in [-1, 1) with 0
// replaced by 0.5, int32 uniform in [-1000, 1000] with 0 replaced by 1, int64 uniform over all
// 2^64 bit patterns with 0 replaced by 1 (so sums wrap around, as they may in use), bf16 the float
// rounded. Never zeros: zeros hide unwritten outputs and can run faster than real data.
cudaError_t FillRandomF32(float* d, int64_t n, uint64_t seed, cudaStream_t stream);
cudaError_t FillRandomI32(int32_t* d, int64_t n, uint64_t seed, cudaStream_t stream);
cudaError_t FillRandomI64(int64_t* d, int64_t n, uint64_t seed, cudaStream_t stream);
cudaError_t FillRandomBf16(uint16_t* d, int64_t n, uint64_t seed, cudaStream_t stream);

// One thread that waits `ns` nanoseconds of %globaltimer. Queued before a timed region, it keeps
// the GPU busy while the host queues the region's launches, so the events time the device work
// and not the host's launch overhead.
cudaError_t Spin(int64_t ns, cudaStream_t stream);
// One block of one warp that does nothing: timed like any run, the method's floor for one kernel
// (the launch after the spin, block dispatch, completion, the events).
cudaError_t EmptyKernel(cudaStream_t stream);

// The SM clock right now, in MHz, into *d_mhz: one thread counts clock64() cycles over `ns`
// nanoseconds of %globaltimer. Queued right after a timed run, it shows whether that run left
// the GPU clocked down (power or thermal limits), which a long tensor-core GEMM can.
cudaError_t ClockProbe(float* d_mhz, int64_t ns, cudaStream_t stream);

// d[i] *= scale for i < n (turns a row sum into a row mean).
cudaError_t ScaleInPlace(float* d, int64_t n, float scale, cudaStream_t stream);

// ||got - want||_2 / ||want||_2 over n floats, in float64, returned through host memory (syncs).
cudaError_t RelativeError(const float* d_got, const float* d_want, int64_t n, double* result,
                          cudaStream_t stream);

// How many of n 64-bit words differ between d_got and d_want, into *mismatches. Syncs.
// For outputs that must be exact (integer sums).
cudaError_t Mismatches64(const uint64_t* d_got, const uint64_t* d_want, int64_t n,
                         uint64_t* mismatches, cudaStream_t stream);

// The transposed input is checked elementwise: 0 when out[c, r] == in[r, c] for every element
// of a 32-bit [rows, cols] matrix, else the number of mismatches (capped). Syncs.
// `first_bad` (optional) gets the smallest input index i = r * cols + c whose element is wrong,
// -1 when none: a whole wrong tile (a race over a shared-memory stage) and a lone wrong element
// (memory or transfer error) look different there.
cudaError_t TransposeMismatches(const uint32_t* d_in, const uint32_t* d_out, int64_t rows,
                                int64_t cols, uint64_t* mismatches, cudaStream_t stream,
                                int64_t* first_bad = nullptr);

}  // namespace opserve::bench
