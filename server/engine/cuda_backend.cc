#include "server/engine/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/stream_marks.h"
#include "server/engine/cuda_backend_impl.h"
#include "server/engine/pinned_pool.h"
#include "server/ops/cuda_launch.h"
#include "server/ops/op.h"

namespace opserve {
namespace {

using cuda::FromCuda;

// The coarsest step of the device's timer that still times a kernel of a few microseconds.
constexpr uint64_t kMaxTimerStepNs = 128;

// Errors after which the CUDA context is unusable: the process must restart to serve again.
bool IsSticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

// Memory a copy engine reaches without staging: page-locked host memory (a registered region)
// or device memory (a CUDA shared memory region).
bool DirectlyCopyable(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost || attr.type == cudaMemoryTypeDevice;
}

// Device memory from the stream-ordered pool, freed on the stream it was allocated on: a buffer
// a lane drops mid-request (an intermediate after its last reader) is reused only after the
// launches that lane queued before the drop, even while other lanes run. A stored tensor is
// marked idle at its commit and freed on the allocation stream instead: the requests that read
// it hold it until their kernels are done, so its free need not wait behind its lane's work.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(void* p, uint64_t bytes, CudaBackend* backend, cudaStream_t stream)
      : Buffer(p, bytes), backend_(backend), stream_(stream) {}
  ~DeviceBuffer() override;
  void SetIdle() override;

 private:
  CudaBackend* backend_;
  cudaStream_t stream_;  // written before the buffer is shared (SetIdle at the commit)
};

DeviceBuffer::~DeviceBuffer() { backend_->Free(data(), bytes(), stream_); }
void DeviceBuffer::SetIdle() { stream_ = backend_->alloc_stream(); }

// Uploads: each chunk is copied into one of two pinned staging blocks and sent with
// cudaMemcpyAsync, so the copy of chunk i overlaps the receipt of chunk i+1. Each call may come
// on another thread (the chunks of one upload arrive on whichever gRPC or pool thread is free),
// so each binds its thread to the device first.
class CudaUploader final : public Uploader {
 public:
  CudaUploader(CudaBackend* backend, BufferPtr dst) : backend_(backend), dst_(std::move(dst)) {
    backend_->BindThread();
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    for (Stage& st : stages_) {
      st.block = backend_->pinned().Acquire();
      cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming);
    }
  }
  ~CudaUploader() override {
    backend_->BindThread();
    cudaStreamSynchronize(stream_);  // no copy may outlive the staging or the buffer
    for (Stage& st : stages_) {
      cudaEventDestroy(st.done);
      backend_->pinned().Release(st.block);
    }
    cudaStreamDestroy(stream_);
  }

  absl::Status Append(const void* data, uint64_t bytes) override {
    backend_->BindThread();
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      Stage& st = stages_[current_];
      if (st.fill == 0 && st.in_flight) {
        RETURN_IF_ERROR(backend_->Check(cudaEventSynchronize(st.done), "upload"));
        st.in_flight = false;
      }
      const uint64_t n = std::min<uint64_t>(bytes, st.block.bytes - st.fill);
      std::memcpy(static_cast<char*>(st.block.ptr) + st.fill, p, n);
      st.fill += n;
      p += n;
      bytes -= n;
      if (st.fill == st.block.bytes) RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    backend_->BindThread();
    if (stages_[current_].fill > 0) RETURN_IF_ERROR(Flush());
    return backend_->Check(cudaStreamSynchronize(stream_), "upload");
  }

 private:
  struct Stage {
    PinnedPool::Block block;
    cudaEvent_t done = nullptr;
    uint64_t fill = 0;
    bool in_flight = false;
  };

  absl::Status Flush() {
    Stage& st = stages_[current_];
    if (st.fill > dst_->bytes() - offset_) return absl::InvalidArgumentError("upload overruns its buffer");
    RETURN_IF_ERROR(backend_->Check(
        cudaMemcpyAsync(static_cast<char*>(dst_->data()) + offset_, st.block.ptr, st.fill,
                        cudaMemcpyHostToDevice, stream_),
        "upload"));
    RETURN_IF_ERROR(backend_->Check(cudaEventRecord(st.done, stream_), "upload"));
    offset_ += st.fill;
    st.fill = 0;
    st.in_flight = true;
    current_ ^= 1;
    return absl::OkStatus();
  }

  CudaBackend* backend_;
  BufferPtr dst_;
  cudaStream_t stream_ = nullptr;
  Stage stages_[2];
  int current_ = 0;
  uint64_t offset_ = 0;
};

// A client's device memory opened through CUDA IPC: not ours to free, only to close.
class SharedDeviceBuffer final : public Buffer {
 public:
  SharedDeviceBuffer(void* p, uint64_t bytes, int device) : Buffer(p, bytes), device_(device) {}
  ~SharedDeviceBuffer() override {
    cudaSetDevice(device_);
    if (cudaIpcCloseMemHandle(data()) != cudaSuccess) cudaGetLastError();
  }

 private:
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device, uint64_t budget,
                                                                 int max_compute_capability,
                                                                 int graph_cache) {
  RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp prop{};
  RETURN_IF_ERROR(FromCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_ERROR(FromCuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const int real_cc = prop.major * 10 + prop.minor;
  if (real_cc < kMinCudaComputeCapability) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, " ", prop.name, " has compute capability ", ComputeCapabilityName(real_cc),
        "; opserve's kernels need ", ComputeCapabilityName(kMinCudaComputeCapability),
        " or newer (docs/DEPLOY.md, \"Supported GPUs\")"));
  }
  if (budget == 0) budget = static_cast<uint64_t>(free_bytes * 0.9);
  std::unique_ptr<CudaBackend> b(new CudaBackend(device, budget, graph_cache));
  // A cap makes the device offer only the rows a GPU of that capability runs (ListOps, auto and
  // validation all read compute_capability()); the description names both.
  const bool capped = max_compute_capability > 0 && max_compute_capability < real_cc;
  b->cc_ = capped ? max_compute_capability : real_cc;
  const std::string cap_note = capped ? absl::StrCat(" capped to ", ComputeCapabilityName(b->cc_),
                                                     " by --max_compute_capability")
                                      : "";
  b->capability_source_ =
      capped ? absl::StrCat(prop.name, ", ", ComputeCapabilityName(real_cc),
                            " capped by --max_compute_capability")
             : std::string(prop.name);
  b->sm_count_ = prop.multiProcessorCount;
  b->smem_per_block_ = static_cast<int>(prop.sharedMemPerBlockOptin);
  b->total_ = total_bytes;
  b->description_ = absl::StrCat("cuda:", device, " ", prop.name, " (sm_", real_cc, cap_note, ", ",
                                 prop.multiProcessorCount, " SMs, ", total_bytes >> 20, " MiB)");
  // Keep freed blocks cached in the pool: after warm-up no request reaches cudaMalloc.
  cudaMemPool_t pool;
  RETURN_IF_ERROR(FromCuda(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool"));
  uint64_t threshold = UINT64_MAX;
  RETURN_IF_ERROR(FromCuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                           "cudaMemPoolSetAttribute"));
  RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&b->alloc_stream_, cudaStreamNonBlocking), "stream"));
  RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&b->copy_stream_, cudaStreamNonBlocking), "stream"));
  // A timer that steps by a microsecond or more would round a small kernel's time away; such a
  // GPU's graphs keep timing nodes with events, whose resolution is about half a microsecond.
  uint64_t step_ns = 0;
  RETURN_IF_ERROR(FromCuda(kernels::MeasureTimerStep(&step_ns, b->copy_stream_), "timer step"));
  b->timer_stamps_ = step_ns > 0 && step_ns <= kMaxTimerStepNs;
  return b;
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  pinned_.Clear();
  if (alloc_stream_) cudaStreamDestroy(alloc_stream_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  for (cudaStream_t s : lane_streams_) cudaStreamDestroy(s);
}

absl::Status CudaBackend::Check(cudaError_t err, absl::string_view what) {
  if (err != cudaSuccess && IsSticky(err)) {
    std::lock_guard<std::mutex> lock(health_mu_);
    if (health_.ok()) {
      health_ = absl::UnavailableError(absl::StrCat("the GPU failed and must be restarted: ",
                                                    cudaGetErrorName(err)));
    }
  }
  return FromCuda(err, what);
}

absl::Status CudaBackend::Healthy() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return health_;
}

absl::StatusOr<BufferPtr> CudaBackend::AllocateOn(uint64_t bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(budget_.Reserve(bytes));
  void* p = nullptr;
  cudaError_t err = cudaMallocAsync(&p, std::max<uint64_t>(bytes, 1), stream);
  if (err != cudaSuccess) {
    budget_.Release(bytes);
    cudaGetLastError();  // an out-of-memory error is not sticky; clear it
    if (err == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(absl::StrCat("the GPU has no ", bytes, " bytes free"));
    }
    return Check(err, "cudaMallocAsync");
  }
  return std::make_shared<DeviceBuffer>(p, bytes, this, stream);
}

absl::StatusOr<BufferPtr> CudaBackend::Allocate(uint64_t bytes) {
  cudaSetDevice(device_);
  ASSIGN_OR_RETURN(BufferPtr b, AllocateOn(bytes, alloc_stream_));
  // Other streams use it next: wait until the pool has handed it over.
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(alloc_stream_), "allocation"));
  return b;
}

void CudaBackend::Free(void* p, uint64_t bytes, cudaStream_t stream) {
  cudaSetDevice(device_);
  cudaFreeAsync(p, stream);
  budget_.Release(bytes);
}

absl::StatusOr<cudaStream_t> CudaBackend::NewLaneStream() {
  RETURN_IF_ERROR(FromCuda(cudaSetDevice(device_), "cudaSetDevice"));
  cudaStream_t s = nullptr;
  RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"));
  std::lock_guard<std::mutex> lock(lanes_mu_);
  lane_streams_.push_back(s);
  return s;
}

absl::Status CudaBackend::CopyOut(const Buffer& src, uint64_t offset, void* dst, uint64_t bytes) {
  cudaSetDevice(device_);
  // Page-locked memory (a registered shared-memory region) and device memory (a CUDA one) take
  // the copy directly.
  if (DirectlyCopyable(dst)) {
    std::lock_guard<std::mutex> lock(copy_mu_);
    RETURN_IF_ERROR(Check(cudaMemcpyAsync(dst, static_cast<const char*>(src.data()) + offset, bytes,
                                          cudaMemcpyDefault, copy_stream_),
                          "download"));
    return Check(cudaStreamSynchronize(copy_stream_), "download");
  }
  // Through pinned staging: pageable device-to-host copies run at a fraction of the bus speed.
  std::lock_guard<std::mutex> lock(copy_mu_);
  PinnedPool::Block block = pinned_.Acquire();
  absl::Status status = CopyOutVia(block, src, offset, dst, bytes);
  pinned_.Release(block);  // on every path: an error must not keep 4 MiB of pinned memory
  return status;
}

absl::Status CudaBackend::CopyIn(Buffer& dst, const void* src, uint64_t bytes) {
  cudaSetDevice(device_);
  std::lock_guard<std::mutex> lock(copy_mu_);
  // Pageable memory goes through the driver's own staging: slower, the same bytes.
  RETURN_IF_ERROR(Check(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyDefault, copy_stream_),
                        "upload"));
  return Check(cudaStreamSynchronize(copy_stream_), "upload");
}

absl::Status CudaBackend::CopyOutVia(PinnedPool::Block block, const Buffer& src, uint64_t offset,
                                     void* dst, uint64_t bytes) {
  const char* s = static_cast<const char*>(src.data()) + offset;
  char* d = static_cast<char*>(dst);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min<uint64_t>(bytes - done, block.bytes);
    RETURN_IF_ERROR(Check(cudaMemcpyAsync(block.ptr, s + done, n, cudaMemcpyDeviceToHost, copy_stream_), "download"));
    RETURN_IF_ERROR(Check(cudaStreamSynchronize(copy_stream_), "download"));
    std::memcpy(d + done, block.ptr, n);
    done += n;
  }
  return absl::OkStatus();
}

void CudaBackend::BindThread() { cudaSetDevice(device_); }

std::unique_ptr<Uploader> CudaBackend::NewUploader(BufferPtr dst) {
  return std::make_unique<CudaUploader>(this, std::move(dst));
}

absl::StatusOr<std::unique_ptr<ExecEnv>> CudaBackend::NewExecEnv(ExecEnv* share_stream_of) {
  return NewCudaExecEnv(this, share_stream_of);
}

absl::Status CudaBackend::RegisterHostMemory(void* p, uint64_t bytes) {
  cudaSetDevice(device_);
  // Portable: a region is registered once but read by whichever GPU a request lands on; to the
  // others a default registration is pageable memory, which the driver stages at a third of the
  // speed.
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // not sticky
  return absl::InternalError(
      absl::StrCat("cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(err)));
}

void CudaBackend::UnregisterHostMemory(void* p) {
  cudaSetDevice(device_);
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<BufferPtr> CudaBackend::OpenSharedDeviceMemory(absl::string_view handle,
                                                              int64_t device_id, uint64_t bytes) {
  if (device_id != device_) {
    return absl::InvalidArgumentError(absl::StrCat("the region is on device ", device_id,
                                                   "; this server runs on cuda:", device_));
  }
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat("raw_handle has ", handle.size(),
                                                   " bytes; a cudaIpcMemHandle_t has ", sizeof(h)));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaSetDevice(device_);
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat("cudaIpcOpenMemHandle: ", cudaGetErrorString(err)));
  }
  return std::make_shared<SharedDeviceBuffer>(p, bytes, device_);
}

MemoryStats CudaBackend::Memory() const { return {budget_.used(), budget_.budget(), total_}; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                                               static_cast<int>(err), "): ", cudaGetErrorString(err)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device");
  return count;
}

absl::Status ProbeCuda(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                                               static_cast<int>(err), "): ", cudaGetErrorString(err)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("cuda:", device, " does not exist; this machine has ",
                                                   count, " device(s)"));
  }
  return FromCuda(cudaSetDevice(device), "cudaSetDevice");
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, uint64_t budget_bytes,
                                                         int max_compute_capability,
                                                         int graph_cache) {
  ASSIGN_OR_RETURN(auto b, CudaBackend::Create(device, budget_bytes, max_compute_capability,
                                               graph_cache));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace opserve
