// transpose: [rows, cols] -> [cols, rows] for elements of elem_bytes = 2 (BFLOAT16), 4 (FLOAT32,
// INT32) or, except in TransposeTma, 8 (INT64). No scratch memory.
#pragma once

#include "kernels/common.h"

namespace opserve::kernels {

#define OPSERVE_DECLARE_TRANSPOSE(Name)                                                       \
  cudaError_t Name(const void* d_in, void* d_out, int64_t rows, int64_t cols, int elem_bytes, \
                   cudaStream_t stream);

// One thread per element: coalesced reads, strided writes.
OPSERVE_DECLARE_TRANSPOSE(TransposeNaive)
// A 32x32 shared-memory tile padded by one element, so column reads hit 32 banks.
OPSERVE_DECLARE_TRANSPOSE(TransposeSmemTiled)
// The same tile with an XOR swizzle of the column index instead of padding.
OPSERVE_DECLARE_TRANSPOSE(TransposeSwizzled)
// sm_90: bulk tensor copies (TMA) with a 128-byte swizzle, several elements per thread.
// The tensor maps are encoded at run time through cudaGetDriverEntryPointByVersion
// (never link libcuda directly). Only the shapes TransposeTmaSupports accepts, with a 16-byte
// aligned d_in; cudaErrorInvalidValue otherwise (no silent fallback).
OPSERVE_DECLARE_TRANSPOSE(TransposeTma)

#undef OPSERVE_DECLARE_TRANSPOSE

// The shapes TransposeTma takes: 2- or 4-byte elements, rows of a 16-byte multiple, dimensions
// below 2^31. Plain host code: no device query.
bool TransposeTmaSupports(int64_t rows, int64_t cols, int elem_bytes);

}  // namespace opserve::kernels
