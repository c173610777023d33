// cuBLAS, loaded on first use with dlopen instead of linked.
//
// Why: libcublasLt's load-time initialisation breaks civetweb's mg_start in the same process
// (prometheus-cpp's exposer then fails with "null context when constructing CivetServer"; seen
// with LD_PRELOAD of libcublasLt.so.13 alone into a CPU-only server). Loading cuBLAS only when
// the CUDA worker makes its handle keeps /metrics working, and a server on a machine without a
// GPU never touches cuBLAS at all.
#pragma once

#include <cublas_v2.h>

namespace opserve::kernels {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasGetStream_v2) get_stream;
  decltype(&cublasSgemm_v2_64) sgemm_64;
  decltype(&cublasGemmEx_64) gemm_ex_64;
  decltype(&cublasSetWorkspace_v2) set_workspace;
};

// The entry points, or nullptr when libcublas.so.13 cannot be loaded (the reason goes to stderr
// once). Thread-safe; loads at most once.
const CublasApi* Cublas();

// A handle bound to `stream`, or nullptr on failure. Destroy it with CublasDestroyHandle.
void* CublasCreateHandle(cudaStream_t stream);
void CublasDestroyHandle(void* handle);

// Gives the handle a workspace of its own (device memory the caller owns and keeps alive, stream
// ordered on the handle's stream; NVIDIA recommends 32 MiB on Hopper) instead of cuBLAS's default
// pool. Call it after every cublasSetStream, which resets the workspace. The server's handles
// have one, so that cuBLAS never allocates inside a CUDA-graph capture; opserve-bench
// --ops=cublas_handles found it neither faster nor slower (docs/performance/matmul.md).
cudaError_t CublasSetWorkspace(void* handle, void* d_workspace, size_t bytes);
// Binds the handle to `stream` (which resets its workspace: set it again after).
cudaError_t CublasSetStream(void* handle, cudaStream_t stream);

}  // namespace opserve::kernels
