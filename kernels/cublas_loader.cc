#include "kernels/cublas_loader.h"

#include <dlfcn.h>

#include <cstdio>

namespace opserve::kernels {
namespace {

template <typename T>
bool Load(void* lib, const char* name, T* fn) {
  *fn = reinterpret_cast<T>(dlsym(lib, name));
  if (*fn == nullptr) std::fprintf(stderr, "opserve: cuBLAS: %s not found\n", name);
  return *fn != nullptr;
}

const CublasApi* LoadCublas() {
  // RTLD_LOCAL: its symbols stay out of the global namespace.
  void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("/usr/local/cuda/lib64/libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "opserve: cuBLAS unavailable: %s\n", dlerror());
    return nullptr;
  }
  static CublasApi api;
  const bool ok = Load(lib, "cublasCreate_v2", &api.create) &&
                  Load(lib, "cublasDestroy_v2", &api.destroy) &&
                  Load(lib, "cublasSetStream_v2", &api.set_stream) &&
                  Load(lib, "cublasGetStream_v2", &api.get_stream) &&
                  Load(lib, "cublasSgemm_v2_64", &api.sgemm_64) &&
                  Load(lib, "cublasGemmEx_64", &api.gemm_ex_64) &&
                  Load(lib, "cublasSetWorkspace_v2", &api.set_workspace);
  return ok ? &api : nullptr;
}

}  // namespace

const CublasApi* Cublas() {
  static const CublasApi* const api = LoadCublas();
  return api;
}

void* CublasCreateHandle(cudaStream_t stream) {
  const CublasApi* api = Cublas();
  if (api == nullptr) return nullptr;
  cublasHandle_t handle = nullptr;
  if (api->create(&handle) != CUBLAS_STATUS_SUCCESS) return nullptr;
  if (api->set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS) {
    api->destroy(handle);
    return nullptr;
  }
  return handle;
}

cudaError_t CublasSetWorkspace(void* handle, void* d_workspace, size_t bytes) {
  const CublasApi* api = Cublas();
  if (api == nullptr || handle == nullptr) return cudaErrorSharedObjectInitFailed;
  return api->set_workspace(static_cast<cublasHandle_t>(handle), d_workspace, bytes) ==
                 CUBLAS_STATUS_SUCCESS
             ? cudaSuccess
             : cudaErrorUnknown;
}

cudaError_t CublasSetStream(void* handle, cudaStream_t stream) {
  const CublasApi* api = Cublas();
  if (api == nullptr || handle == nullptr) return cudaErrorSharedObjectInitFailed;
  return api->set_stream(static_cast<cublasHandle_t>(handle), stream) == CUBLAS_STATUS_SUCCESS
             ? cudaSuccess
             : cudaErrorUnknown;
}

void CublasDestroyHandle(void* handle) {
  if (handle != nullptr && Cublas() != nullptr) Cublas()->destroy(static_cast<cublasHandle_t>(handle));
}

}  // namespace opserve::kernels
