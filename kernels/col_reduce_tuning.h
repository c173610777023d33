// The knobs of ColReduce (kernels/col_reduce.cu), for the kernel layer and its benchmark only:
// ColReduce runs ColReduceDefaultTuning(). opserve-bench --ops=col_sweep times every supported
// combination on FLOAT32, which is how the default was chosen (docs/performance/history.md).
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

struct ColReduceTuning {
  // 16-byte vectors side by side a thread owns along a row (a warp then reads 512 * vecs
  // contiguous bytes per row): 1, 2 or 4.
  int vecs = 1;
  // Rows a thread loads before it adds any (vecs * unroll loads in flight): with vecs 1 or 2:
  // 4, 8 or 16; with vecs 4: 2, 4 or 8.
  int unroll = 8;
  // The grid: column strips x chunks of rows >= SMs x this many blocks.
  int blocks_per_sm = 2;
};

ColReduceTuning ColReduceDefaultTuning();

// ColReduce of FLOAT32 with explicit knobs (the temp size depends on them: query with the same
// tuning); cudaErrorInvalidValue for a combination that is not built.
cudaError_t ColReduceTuned(const ColReduceTuning& tuning, void* d_temp, size_t* temp_bytes,
                           const float* d_in, float* d_out, int64_t rows, int64_t cols, bool mean,
                           cudaStream_t stream);

}  // namespace opserve::kernels
