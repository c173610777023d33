#include "kernels/sm90/tensor_map.h"

#include <cuda_runtime_api.h>

namespace opserve::kernels::sm90 {

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiledFn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                             cudaEnableDefault, &query);
    if (err != cudaSuccess) (void)cudaGetLastError();  // leave no stale error for the launch check
    return err == cudaSuccess && query == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p)
               : nullptr;
  }();
  return fn;
}

bool EncodeSwizzled128(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows,
                       int64_t cols, int elem_bytes, int box_rows, int box_cols,
                       CUtensorMapL2promotion promotion) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiledFn();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  // Bytes from one row to the next (dimension 0 is contiguous and takes no stride).
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) *
                                 static_cast<cuuint64_t>(elem_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace opserve::kernels::sm90
