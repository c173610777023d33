// Host side of the Hopper TMA kernels: cuTensorMapEncodeTiled, fetched from the driver at run
// time, and the 2-D tensor map both kernels (transpose_tma.cu, matmul_tensor_core_sm90a.cu) build
// with it. Plain C++: the kernel layer never links libcuda (its binaries start on machines with no
// driver), so the driver function comes through the runtime's cudaGetDriverEntryPointByVersion.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums: types only
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <cstdint>

namespace opserve::kernels::sm90 {

// cuTensorMapEncodeTiled (the CUDA 12.0 ABI), looked up once per process; nullptr when the driver
// does not provide it. A failed lookup leaves no error behind for the caller's launch check.
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiledFn();

// Encodes `map` for a row-major [rows][cols] matrix of `type` (elem_bytes each) at `base`, boxes
// of box_rows x box_cols elements, 128-byte swizzle (box_cols * elem_bytes must then be at most
// 128), no interleave, and zero fill outside the matrix (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE).
// Dimension 0 of the map is the contiguous one (columns). `promotion` is the L2 sector promotion
// of the loads. False when the driver has no encoder or refuses the description (a base not
// 16-byte aligned, a row stride not a multiple of 16 bytes, a dimension past 2^32, ...).
bool EncodeSwizzled128(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows,
                       int64_t cols, int elem_bytes, int box_rows, int box_cols,
                       CUtensorMapL2promotion promotion);

}  // namespace opserve::kernels::sm90
