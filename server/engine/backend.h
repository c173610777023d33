// A backend owns one device: its memory (through a budget), its copies and its execution
// context. The CPU reference backend and the CUDA backend implement it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/ops/op.h"
#include "server/ops/tensor.h"

namespace opserve {

// A block of backend memory (host memory on the CPU backend, device memory on CUDA). Destroying
// it returns the memory to its pool and releases its bytes from the memory budget.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // Says that no queued device work uses the buffer any more (its request finished): when it
  // is dropped, its memory may go back at once instead of in its lane's stream order.
  virtual void SetIdle() {}

 protected:
  Buffer(void* data, uint64_t bytes) : data_(data), bytes_(bytes) {}

 private:
  void* data_;
  uint64_t bytes_;
};
using BufferPtr = std::shared_ptr<Buffer>;

// Bytes a backend may hold at once: stored tensors, intermediates and scratch together.
// Reserve fails with RESOURCE_EXHAUSTED instead of growing past the budget.
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t budget_bytes) : budget_(budget_bytes) {}
  absl::Status Reserve(uint64_t bytes);
  void Release(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t budget() const { return budget_; }

 private:
  const uint64_t budget_;
  std::atomic<uint64_t> used_{0};
};

// How a request's kernels were queued: node by node, or as a CUDA graph (ExecEnv::LaunchAsGraph).
// kRebound: replayed after an update that bound the request's tensors (another address than
// the graph had), which costs a capture on the host.
enum class GraphReplay { kNotUsed, kCaptured, kReplayed, kRebound };

// A request's execution context on one device lane: what the kernels see (KernelEnv: stream,
// cuBLAS handle, scratch) and what the executor drives. A lane's launch thread queues a request's
// work on a context and its completion thread finishes it (Finish onwards); the lane's contexts
// share its stream, so one request is launched while the one before it runs.
class ExecEnv : public KernelEnv {
 public:
  // The next node's inputs that are still arriving, by input (nullptr: there), for arriving();
  // the executor sets them around each node's run.
  void set_arriving(std::vector<const InputArrival*> inputs) { arriving_ = std::move(inputs); }
  const InputArrival* arriving(int input) const override {
    return input >= 0 && input < static_cast<int>(arriving_.size()) ? arriving_[input] : nullptr;
  }

  // Memory for a node's output or an inline input, ordered on this context's stream: it is
  // usable by the next launch at once, and a buffer dropped mid-request is reused only after
  // the launches queued before the drop. Charged to the backend's budget.
  virtual absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) = 0;
  // Memory that lives no longer than this request (an intermediate, a returned output, an inline
  // input): valid until the next BeginRequest() on this context. On CUDA it comes from the
  // context's own arena when it fits, so a small request makes no allocation call at all, and
  // the same plan gets the same addresses each time (its CUDA graph replays unchanged).
  virtual absl::StatusOr<BufferPtr> AllocateTransient(uint64_t bytes) { return Allocate(bytes); }
  // Copies host bytes into `dst`, in stream order. `src` must stay valid until Finish().
  virtual absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) = 0;
  // Sets `bytes` bytes of `dst` to `byte`, in stream order (no kernel of the op's runs: the
  // output of a node whose input is empty).
  virtual absl::Status Fill(Buffer& dst, uint8_t byte, uint64_t bytes) = 0;
  // Called once at the start of each request, of `num_nodes` nodes.
  virtual void BeginRequest(int num_nodes) {}
  // Host memory for a returned output of `bytes`, which CopyToStaging fills in stream order so
  // that the request's one wait (Finish) covers the copy too. The bytes are there after Finish()
  // and stay until the next BeginRequest(). nullptr: none (no staging area here, or larger than
  // it); the caller copies with Backend::CopyOut after Finish instead.
  virtual absl::StatusOr<void*> ReserveStaging(uint64_t bytes) { return nullptr; }
  // Queues the copy of `src` into `dst` (from ReserveStaging); inside LaunchAsGraph's `launch`
  // it becomes part of the graph.
  virtual absl::Status CopyToStaging(const Buffer& src, void* dst, uint64_t bytes) {
    return absl::UnimplementedError("no staging area on this device");
  }
  // Brackets node `i`'s kernels for timing (CUDA events or the host clock).
  virtual void MarkStart(int i) = 0;
  virtual void MarkEnd(int i) = 0;
  // Waits until node `i`'s kernels (up to MarkEnd(i)) are done; a no-op where kernels run
  // synchronously. The executor calls it before queueing the node after next, so an abandoned
  // request leaves at most the running node and one queued node for the device to finish.
  virtual absl::Status WaitNode(int i) { return absl::OkStatus(); }
  // Called once the request's device work is all queued: Finish then waits for that work, not
  // for what another context queues after it on the lane's stream. Reports a launch error.
  virtual absl::Status Launched() { return absl::OkStatus(); }
  // Waits for the device (once per request: for the work queued up to Launched(), or for all of
  // this context's work when a failed request drains) and returns each marked node's seconds.
  // Frees the scratch. A device error here is reported against the request.
  virtual absl::StatusOr<std::vector<double>> Finish(int num_nodes) = 0;
  // Whether LaunchAsGraph runs graphs here (a CUDA context with a graph cache).
  virtual bool LaunchesGraphs() const { return false; }
  // Queues the work `launch` queues (the request's nodes, with their timing marks) as one CUDA
  // graph kept under `key`, the request's signature: captured from `launch` the first time,
  // replayed after. `bindings` are every device address the nodes read or write; when they
  // differ from the cached graph's, `launch` is captured again and the graph updated in place,
  // which still costs one launch on the device. Within `launch`, Scratch comes from memory
  // the graph keeps, Allocate must not be called, and nothing may wait for the device.
  // kNotUsed: `launch` ran directly (no graph cache here, or kernels a graph cannot capture).
  virtual absl::StatusOr<GraphReplay> LaunchAsGraph(const std::string& key,
                                               std::span<const void* const> bindings,
                                               const std::function<absl::Status()>& launch) {
    if (absl::Status s = launch(); !s.ok()) return s;
    return GraphReplay::kNotUsed;
  }
#if OPSERVE_TEST_HOOKS
  // Test builds only: fail the way a faulty kernel does on this device (on CUDA, an
  // illegal-address launch whose sticky error Finish reports).
  virtual absl::Status InjectFault() { return absl::InternalError("injected kernel fault"); }
#endif

 private:
  std::vector<const InputArrival*> arriving_;
};

// Streams one tensor's bytes into a buffer, chunk by chunk (PutTensor).
class Uploader {
 public:
  virtual ~Uploader() = default;
  virtual absl::Status Append(const void* data, uint64_t bytes) = 0;
  // Waits until every appended byte is in the buffer.
  virtual absl::Status Finish() = 0;
};

struct MemoryStats {
  uint64_t used = 0;
  uint64_t budget = 0;
  uint64_t total = 0;  // the device's memory
};

// The memory and copies of one device. Its DeviceProperties (name: the table's backend column,
// compute capability, SM count) decide which of the op table's rows it runs.
class Backend : public DeviceProperties {
 public:
  virtual std::string device() const = 0;       // "cpu" or "cuda:0"
  virtual std::string description() const = 0;  // e.g. "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)"
  // Makes the calling thread's device calls go to this backend's device. CUDA's current device
  // is per thread and starts at 0, so every thread that works for a device other than cuda:0
  // (a lane's launch and completion threads) calls this before its first device call.
  virtual void BindThread() {}

  // Memory charged to the budget; RESOURCE_EXHAUSTED when it would not fit.
  virtual absl::StatusOr<BufferPtr> Allocate(uint64_t bytes) = 0;
  // A blocking copy from a buffer no device work is still writing (a stored tensor, or an
  // output after ExecEnv::Finish).
  virtual absl::Status CopyOut(const Buffer& src, uint64_t offset, void* dst,
                               uint64_t bytes) = 0;
  // A blocking copy into a buffer no device work uses yet, from host memory or from device
  // memory of this backend (a CUDA shared memory region): a tensor put from a region.
  virtual absl::Status CopyIn(Buffer& dst, const void* src, uint64_t bytes) = 0;
  virtual std::unique_ptr<Uploader> NewUploader(BufferPtr dst) = 0;
  // An execution context, made on a lane's launch thread. With `share_stream_of`, the new
  // context queues its work on that context's stream and cuBLAS handle (one lane's contexts).
  virtual absl::StatusOr<std::unique_ptr<ExecEnv>> NewExecEnv(ExecEnv* share_stream_of = nullptr) = 0;
  // Host memory the device then copies to and from at the host link's speed (a registered
  // shared-memory region: cudaHostRegister on CUDA). Undone by UnregisterHostMemory, which must
  // not run while a copy may still use it. Nothing to do on the CPU.
  virtual absl::Status RegisterHostMemory(void* p, uint64_t bytes) { return absl::OkStatus(); }
  virtual void UnregisterHostMemory(void* p) {}
  // Device memory another process shares with this one (CUDA IPC: `handle` is the bytes of its
  // cudaIpcMemHandle_t, made on device `device_id`), as a Buffer outside the memory budget,
  // unmapped when the last reference goes. INVALID_ARGUMENT for another device than this one's.
  virtual absl::StatusOr<BufferPtr> OpenSharedDeviceMemory(absl::string_view handle,
                                                           int64_t device_id, uint64_t bytes) {
    return absl::UnimplementedError("CUDA shared memory needs the CUDA backend; this server runs on " +
                                    device());
  }
  // OK while the device can serve; a sticky device error makes it fail for good.
  virtual absl::Status Healthy() const { return absl::OkStatus(); }
  virtual MemoryStats Memory() const = 0;
};

}  // namespace opserve
