// The CUDA backend's execution contexts (ExecEnv): each runs one request at a time on its lane's
// stream, with its own timing marks, graph cache, arena and pinned staging.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cublas_loader.h"
#include "kernels/stream_marks.h"
#if OPSERVE_TEST_HOOKS
#include "kernels/test_fault.h"
#endif
#include "server/engine/cuda_backend_impl.h"
#include "server/engine/cuda_graph_cache.h"
#include "server/engine/cuda_node_timer.h"
#include "server/ops/cuda_launch.h"

namespace opserve {
namespace {

using cuda::FromCuda;

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

  absl::Status AwaitArrival(const InputArrival& a, size_t chunk) override {
    if (chunk >= a.events.size()) return absl::InternalError("no such chunk of an arriving input");
    return backend_->Check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream()),
                                               static_cast<cudaEvent_t>(a.events[chunk]), 0),
                           "waiting for an input copied in from another device");
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

#if OPSERVE_TEST_HOOKS
  absl::Status InjectFault() override {
    // The launch itself succeeds; the fault surfaces at Finish, as a real one would.
    return FromCuda(kernels::LaunchIllegalAddressForTest(stream_), "injected fault");
  }
#endif
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

}  // namespace

absl::StatusOr<std::unique_ptr<ExecEnv>> NewCudaExecEnv(CudaBackend* backend,
                                                        ExecEnv* share_stream_of) {
  auto env = std::make_unique<CudaExecEnv>(backend);
  RETURN_IF_ERROR(env->Init(static_cast<CudaExecEnv*>(share_stream_of)));
  return env;
}

}  // namespace opserve
