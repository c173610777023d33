#include "server/engine/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cublas_loader.h"
#include "kernels/stream_marks.h"
#include "kernels/test_fault.h"
#include "server/ops/cuda_launch.h"
#include "server/engine/cuda_graph_cache.h"
#include "server/engine/cuda_node_timer.h"
#include "server/engine/pinned_pool.h"
#include "server/ops/op.h"
#include "common/status_macros.h"

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

class CudaBackend;

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

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device, uint64_t budget,
                                                             int max_compute_capability,
                                                             int graph_cache);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device() const override { return absl::StrCat("cuda:", device_); }
  std::string description() const override { return description_; }
  int compute_capability() const override { return cc_; }
  std::string capability_source() const override { return capability_source_; }
  int sm_count() const override { return sm_count_; }
  int max_shared_memory_per_block() const override { return smem_per_block_; }

  absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) override;
  absl::Status CopyOut(const Buffer& src, uint64_t offset, void* dst, uint64_t bytes) override;
  absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) override;
  std::unique_ptr<Uploader> NewUploader(BufferPtr dst) override;
  absl::StatusOr<std::unique_ptr<ExecEnv>> NewExecEnv(ExecEnv* share_stream_of) override;
  absl::Status Healthy() const override;
  MemoryStats Memory() const override;
  absl::Status RegisterHostMemory(void* p, uint64_t bytes) override;
  void UnregisterHostMemory(void* p) override;
  absl::StatusOr<BufferPtr> OpenSharedDeviceMemory(absl::string_view handle, int64_t device_id,
                                                   uint64_t bytes) override;

  // For the buffers and the execution context.
  absl::StatusOr<BufferPtr> AllocateOn(uint64_t bytes, cudaStream_t stream);
  void Free(void* p, uint64_t bytes, cudaStream_t stream);
  cudaStream_t alloc_stream() const { return alloc_stream_; }
  // A stream for one lane's execution context. The backend owns it, so that buffers allocated
  // on it can still be freed on it after the context is gone (stored tensors outlive lanes).
  absl::StatusOr<cudaStream_t> NewLaneStream();
  absl::Status Check(cudaError_t err, absl::string_view what);
  PinnedPool& pinned() { return pinned_; }
  int device_index() const { return device_; }
  int graph_cache() const { return graph_cache_; }
  // Whether graphs time their nodes with the device's timer (CudaNodeTimer).
  bool timer_stamps() const { return timer_stamps_; }

 private:
  absl::Status CopyOutVia(PinnedPool::Block block, const Buffer& src, uint64_t offset, void* dst,
                          uint64_t bytes);
  CudaBackend(int device, uint64_t budget, int graph_cache)
      : device_(device), budget_(budget), graph_cache_(graph_cache) {}

  const int device_;
  MemoryBudget budget_;
  const int graph_cache_;  // graphs per execution context (CudaGraphCache)
  bool timer_stamps_ = false;
  std::string description_;
  int cc_ = 0;  // the GPU's own, or the cap below it (--max_compute_capability)
  std::string capability_source_;
  int sm_count_ = 0;
  int smem_per_block_ = 0;
  uint64_t total_ = 0;
  cudaStream_t alloc_stream_ = nullptr;    // allocations made off the worker (uploads)
  cudaStream_t copy_stream_ = nullptr;     // downloads (GetTensor, returned outputs)
  std::mutex copy_mu_;
  std::mutex lanes_mu_;
  std::vector<cudaStream_t> lane_streams_;  // destroyed with the backend
  PinnedPool pinned_;
  mutable std::mutex health_mu_;
  absl::Status health_;
};

DeviceBuffer::~DeviceBuffer() { backend_->Free(data(), bytes(), stream_); }
void DeviceBuffer::SetIdle() { stream_ = backend_->alloc_stream(); }

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

// Uploads: each chunk is copied into one of two pinned staging blocks and sent with
// cudaMemcpyAsync, so the copy of chunk i overlaps the receipt of chunk i+1.
class CudaUploader final : public Uploader {
 public:
  CudaUploader(CudaBackend* backend, BufferPtr dst) : backend_(backend), dst_(std::move(dst)) {
    cudaSetDevice(backend_->device_index());
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    for (Stage& st : stages_) {
      st.block = backend_->pinned().Acquire();
      cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming);
    }
  }
  ~CudaUploader() override {
    cudaStreamSynchronize(stream_);  // no copy may outlive the staging or the buffer
    for (Stage& st : stages_) {
      cudaEventDestroy(st.done);
      backend_->pinned().Release(st.block);
    }
    cudaStreamDestroy(stream_);
  }

  absl::Status Append(const void* data, uint64_t bytes) override {
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

std::unique_ptr<Uploader> CudaBackend::NewUploader(BufferPtr dst) {
  return std::make_unique<CudaUploader>(this, std::move(dst));
}

// An execution context's arena: device memory for the transient buffers of its requests, kept
// from one request to the next. Like the cuBLAS workspace it is the context's own, outside the
// memory budget, and bounded (kMaxArenaBytes per context): the budget is what clients can hold.
class ArenaMemory final : public Buffer {
 public:
  ArenaMemory(void* p, uint64_t bytes, cudaStream_t stream) : Buffer(p, bytes), stream_(stream) {}
  ~ArenaMemory() override { cudaFreeAsync(data(), stream_); }

 private:
  cudaStream_t stream_;
};

// A piece of an arena: freed with the arena, not on its own. It holds the arena, so the memory
// stays while any piece of it does.
class ArenaBuffer final : public Buffer {
 public:
  ArenaBuffer(void* p, uint64_t bytes, BufferPtr arena) : Buffer(p, bytes), arena_(std::move(arena)) {}

 private:
  BufferPtr arena_;
};

// A lane's stream and cuBLAS handle, shared by the lane's contexts.
struct LaneStream {
  ~LaneStream() {
    if (stream) cudaStreamSynchronize(stream);
    kernels::CublasDestroyHandle(blas);
    if (blas_workspace) cudaFree(blas_workspace);
  }
  // cuBLAS's own recommendation for Hopper; a workspace the handle owns keeps cuBLAS from
  // allocating while a CUDA graph is captured.
  static constexpr size_t kBlasWorkspaceBytes = 32 << 20;
  cudaStream_t stream = nullptr;  // owned by the backend (NewLaneStream)
  void* blas = nullptr;           // a cublasHandle_t
  void* blas_workspace = nullptr;
};

// One execution context of a lane: its timing events, scratch and staging, on the lane's stream.
class CudaExecEnv final : public ExecEnv {
 public:
  explicit CudaExecEnv(CudaBackend* backend)
      : backend_(backend),
        timer_(backend->timer_stamps()),
        graphs_(
            backend->graph_cache(), [backend](uint64_t bytes) { return backend->Allocate(bytes); },
            [this](cudaStream_t s) { return BindBlas(s); }) {}
  ~CudaExecEnv() override {
    if (stream_) cudaStreamSynchronize(stream_);
    graphs_.Clear();  // before the events and stamps its graphs record
    if (staging_) cudaFreeHost(staging_);
    if (done_) cudaEventDestroy(done_);
  }

  absl::Status Init(CudaExecEnv* share_stream_of) {
    RETURN_IF_ERROR(FromCuda(cudaSetDevice(backend_->device_index()), "cudaSetDevice"));
    if (share_stream_of != nullptr) {
      lane_ = share_stream_of->lane_;
    } else {
      lane_ = std::make_shared<LaneStream>();
      ASSIGN_OR_RETURN(lane_->stream, backend_->NewLaneStream());
      lane_->blas = kernels::CublasCreateHandle(lane_->stream);
      if (lane_->blas == nullptr) return absl::InternalError("cuBLAS: no handle (see the log for why)");
      RETURN_IF_ERROR(FromCuda(cudaMalloc(&lane_->blas_workspace, LaneStream::kBlasWorkspaceBytes),
                               "cuBLAS workspace"));
      RETURN_IF_ERROR(BindBlas(lane_->stream));
    }
    stream_ = lane_->stream;
    if (backend_->graph_cache() > 0) {
      ASSIGN_OR_RETURN(capture_stream_, backend_->NewLaneStream());
    }
    RETURN_IF_ERROR(FromCuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event"));
    // Made now rather than by the first requests: timing for a few nodes, and the staging.
    timer_.Init(kNodesAtStart);
    (void)Stage(1);
    staged_ = 0;
    return absl::OkStatus();
  }

  // While a graph is captured, the kernels go to the capture stream (CudaGraphCache::Launch).
  // A launcher asks for the stream or the cuBLAS handle to queue work: the node timer's next
  // boundary then needs a stamp of its own.
  void* stream() override {
    if (!graphs_.capturing()) return stream_;
    timer_.Flush(capture_stream_);
    timer_.Queued();
    return capture_stream_;
  }
  void* blas_handle() override {
    if (graphs_.capturing()) {
      timer_.Flush(capture_stream_);
      timer_.Queued();
    }
    return lane_->blas;
  }

  absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) override {
    return backend_->AllocateOn(bytes, stream_);
  }
  // From the arena while it has room, else from the pool; an arena too small for a request is
  // grown before the next one (BeginRequest), up to kMaxArenaBytes.
  absl::StatusOr<BufferPtr> AllocateTransient(uint64_t bytes) override {
    const uint64_t aligned = Aligned(std::max<uint64_t>(bytes, 1));
    transient_bytes_ += aligned;
    if (arena_ != nullptr && arena_used_ + aligned <= arena_->bytes()) {
      void* p = static_cast<char*>(arena_->data()) + arena_used_;
      arena_used_ += aligned;
      return std::make_shared<ArenaBuffer>(p, bytes, arena_);
    }
    // Room for all of this request's transient buffers, the pool's among them, next time.
    arena_want_ = std::min(std::max(arena_want_, transient_bytes_), kMaxArenaBytes);
    return backend_->AllocateOn(bytes, stream_);
  }
  absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) override {
    return backend_->Check(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyHostToDevice, stream_),
                           "inline upload");
  }
  // On stream(): inside a graph's capture, the fill is a node of the graph.
  absl::Status Fill(Buffer& dst, uint8_t byte, uint64_t bytes) override {
    return backend_->Check(
        cudaMemsetAsync(dst.data(), byte, bytes, static_cast<cudaStream_t>(stream())), "fill");
  }
  absl::StatusOr<void*> Scratch(uint64_t bytes) override {
    if (graphs_.capturing()) return graphs_.CaptureScratch(bytes);
    ASSIGN_OR_RETURN(BufferPtr b, AllocateTransient(bytes));
    scratch_.push_back(b);
    return b->data();
  }
  // The context's last request is done (Finish): its transient memory and staging are free.
  void BeginRequest(int num_nodes) override {
    timer_.BeginRequest(num_nodes);
    staged_ = 0;
    arena_used_ = 0;
    transient_bytes_ = 0;
    if (arena_want_ > (arena_ ? arena_->bytes() : 0)) {
      // Stream-ordered: the old arena goes back after the work queued on it. Without room for
      // the new one, requests use the pool as before.
      arena_.reset();
      void* p = nullptr;
      if (cudaMallocAsync(&p, arena_want_, stream_) == cudaSuccess) {
        arena_ = std::make_shared<ArenaMemory>(p, arena_want_, stream_);
      } else {
        (void)cudaGetLastError();  // out of memory is not sticky
      }
      arena_want_ = 0;
    }
  }

  // Small outputs go through one page-locked area, grown (between requests only) up to
  // kMaxStagingBytes; larger ones are left to Backend::CopyOut.
  absl::StatusOr<void*> ReserveStaging(uint64_t bytes) override {
    if (bytes == 0) return nullptr;
    return Stage(bytes);
  }
  // A small output is copied by a kernel: in a graph a copy node ends about 3 us later than the
  // kernel does (bench/diag/graph_marks.cu). In a capture the kernel also writes the stamp of
  // the boundary before it, if nothing has yet (stream() then has none to flush).
  absl::Status CopyToStaging(const Buffer& src, void* dst, uint64_t bytes) override {
    const bool by_kernel = bytes <= kKernelCopyMaxBytes;
    uint64_t* stamp = by_kernel && graphs_.capturing() ? timer_.TakePending() : nullptr;
    auto s = static_cast<cudaStream_t>(stream());
    return backend_->Check(by_kernel
                               ? kernels::LaunchCopyToHost(src.data(), dst, bytes, s, stamp)
                               : cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyDeviceToHost, s),
                           "output download");
  }

  absl::Status InjectFault() override {
    // The launch itself succeeds; the fault surfaces at Finish, as a real one would.
    return FromCuda(kernels::LaunchIllegalAddressForTest(stream_), "injected fault");
  }
  void MarkStart(int i) override {
    timer_.Mark(i, /*end=*/false, stream_, capture_stream_, graphs_.capturing());
  }
  void MarkEnd(int i) override {
    timer_.Mark(i, /*end=*/true, stream_, capture_stream_, graphs_.capturing());
  }
  bool LaunchesGraphs() const override { return backend_->graph_cache() > 0; }
  absl::StatusOr<GraphReplay> LaunchAsGraph(const std::string& key,
                                            std::span<const void* const> bindings,
                                            const std::function<absl::Status()>& launch) override {
    auto captured = [&]() -> absl::Status {
      if (graphs_.capturing()) timer_.BeginCapture();
      RETURN_IF_ERROR(launch());
      // The graph's last boundary, when no copy kernel followed it to write its stamp.
      if (graphs_.capturing()) timer_.Flush(capture_stream_);
      return absl::OkStatus();
    };
    return graphs_.Launch(stream_, capture_stream_, key, bindings, captured, timer_.stamps());
  }
  absl::Status WaitNode(int i) override {
    return backend_->Check(cudaEventSynchronize(timer_.EndEvent(i)), "device");
  }

  absl::Status Launched() override {
    launched_ = true;
    // A launch error a launcher did not report must not fail the next request's launch check.
    RETURN_IF_ERROR(backend_->Check(cudaGetLastError(), "launch"));
    return backend_->Check(cudaEventRecord(done_, stream_), "launch");
  }

  absl::StatusOr<std::vector<double>> Finish(int num_nodes) override {
    // The request's one wait for the device. A request that failed before Launched() drains
    // everything queued on the stream so far, on the launch thread.
    cudaError_t err = launched_ ? cudaEventSynchronize(done_) : cudaStreamSynchronize(stream_);
    if (!launched_ && err == cudaSuccess) err = cudaGetLastError();
    launched_ = false;
    scratch_.clear();
    RETURN_IF_ERROR(backend_->Check(err, "device"));
    return timer_.Seconds(num_nodes);
  }

 private:

  // The lane's cuBLAS handle on `s`, with its own workspace (which cublasSetStream resets).
  absl::Status BindBlas(cudaStream_t s) {
    RETURN_IF_ERROR(FromCuda(kernels::CublasSetStream(lane_->blas, s), "cublasSetStream"));
    return FromCuda(kernels::CublasSetWorkspace(lane_->blas, lane_->blas_workspace,
                                                LaneStream::kBlasWorkspaceBytes),
                    "cublasSetWorkspace");
  }

  static uint64_t Aligned(uint64_t bytes) {
    constexpr uint64_t kAlign = 256;  // as cudaMallocAsync's, for vector loads
    return (bytes + kAlign - 1) / kAlign * kAlign;
  }

  // Room for `bytes` more in the page-locked area, grown (between requests only) up to
  // kMaxStagingBytes; nullptr when it has none: larger outputs are left to Backend::CopyOut.
  char* Stage(uint64_t bytes) {
    const uint64_t need = staged_ + Aligned(bytes);
    if (need > kMaxStagingBytes) return nullptr;
    if (need > staging_bytes_) {
      if (staged_ > 0) return nullptr;  // copies into the current area are queued
      uint64_t grown = std::max<uint64_t>(staging_bytes_ * 2, 1 << 20);
      while (grown < need) grown *= 2;
      grown = std::min(grown, kMaxStagingBytes);
      if (staging_) cudaFreeHost(staging_);
      staging_ = nullptr;
      staging_bytes_ = 0;
      if (cudaMallocHost(&staging_, grown) != cudaSuccess) {
        cudaGetLastError();
        staging_ = nullptr;
        return nullptr;
      }
      staging_bytes_ = grown;
    }
    char* dst = static_cast<char*>(staging_) + staged_;
    staged_ = need;
    return dst;
  }

  static constexpr uint64_t kMaxStagingBytes = 16 << 20;
  static constexpr uint64_t kMaxArenaBytes = 16 << 20;
  static constexpr int kNodesAtStart = 8;
  static constexpr uint64_t kKernelCopyMaxBytes = 64 << 10;

  CudaBackend* backend_;
  std::shared_ptr<LaneStream> lane_;
  cudaStream_t stream_ = nullptr;  // lane_->stream
  cudaStream_t capture_stream_ = nullptr;  // this context's alone; owned by the backend
  cudaEvent_t done_ = nullptr;     // recorded by Launched(), waited for by Finish()
  bool launched_ = false;
  void* staging_ = nullptr;  // page-locked, for ReserveStaging
  uint64_t staging_bytes_ = 0;
  uint64_t staged_ = 0;      // bytes of it this request uses
  BufferPtr arena_;          // device memory for transient buffers; none until a request needs it
  uint64_t arena_used_ = 0;  // bytes of it this request uses
  uint64_t transient_bytes_ = 0;  // this request's transient buffers, in the arena or not
  uint64_t arena_want_ = 0;  // what the last requests would have used, for BeginRequest
  CudaNodeTimer timer_;
  std::vector<BufferPtr> scratch_;
  CudaGraphCache graphs_;
};

absl::StatusOr<std::unique_ptr<ExecEnv>> CudaBackend::NewExecEnv(ExecEnv* share_stream_of) {
  auto env = std::make_unique<CudaExecEnv>(this);
  RETURN_IF_ERROR(env->Init(static_cast<CudaExecEnv*>(share_stream_of)));
  return env;
}

absl::Status CudaBackend::RegisterHostMemory(void* p, uint64_t bytes) {
  cudaSetDevice(device_);
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // not sticky
  return absl::InternalError(
      absl::StrCat("cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(err)));
}

void CudaBackend::UnregisterHostMemory(void* p) {
  cudaSetDevice(device_);
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

namespace {

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

}  // namespace

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
