// Broadcasts left running (Collectives::StartBroadcast): blocks of columns queued as pitched peer
// copies on the destinations' streams, each followed by an event that a reader's stream waits
// on. Columns rather than rows, so that a GEMM reading B computes whole columns of C from each
// block and writes every element of C once (blocks of B's rows would make each later GEMM slice
// read and write all of C again: 1 GiB more for a 16384 x 8192 FLOAT32 C). Copy engines,
// not NCCL: NCCL's kernels need multiprocessors, and the GEMMs these copies feed hold every one
// of them, so NCCL's chunks would wait for the GEMMs they should run beside (measured on two
// H200s: 128 MiB took 3.5 ms beside the GEMMs, against 0.38 ms as peer copies).
#include <algorithm>

#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/cuda_collectives_internal.h"

namespace opserve::cuda_collectives_internal {

// StartBroadcast's copies: per destination, an event after each block on that device's stream
// (the readers' waits), and a timing pair around them.
class CudaArrivingBroadcast final : public ArrivingBroadcast {
 public:
  struct Dest {
    int index = 0;  // in the collectives' device list
    std::shared_ptr<InputArrival> arrival;
    cudaEvent_t start = nullptr, end = nullptr;  // timing; `end` is also the last chunk's event
  };

  CudaArrivingBroadcast(CudaCollectives& owner, std::string what)
      : owner_(owner), what_(std::move(what)) {}
  ~CudaArrivingBroadcast() override {
    double us = 0;
    (void)Finish(&us);
    KeepCurrentDevice keep;
    for (Dest& d : dests_) {
      Handled(cudaSetDevice(owner_.devices_[d.index].ordinal));
      if (d.start != nullptr) Handled(cudaEventDestroy(d.start));
    }
  }

  std::shared_ptr<const InputArrival> arrival(int device) const override {
    for (const Dest& d : dests_) {
      if (d.index == device) return d.arrival;
    }
    return nullptr;
  }

  absl::Status Finish(double* us) override {
    *us = us_;
    if (finished_) return status_;
    finished_ = true;
    KeepCurrentDevice keep;
    auto wait = [&](int index, cudaEvent_t e) {
      const CudaCollectives::Device& d = owner_.devices_[index];
      cudaError_t err = Handled(cudaSetDevice(d.ordinal));
      if (err == cudaSuccess) err = Handled(cudaEventSynchronize(e));
      if (err != cudaSuccess && status_.ok()) {
        status_ =
            absl::InternalError(absl::StrCat(what_, ": waiting on ", d.name, ": ", CudaText(err)));
      }
      return err == cudaSuccess;
    };
    // A queue cut short may have copies running behind no recorded event: wait for the streams.
    for (const Dest& d : dests_) {
      if (queued_) break;
      const CudaCollectives::Device& dev = owner_.devices_[d.index];
      cudaError_t err = Handled(cudaSetDevice(dev.ordinal));
      if (err == cudaSuccess) err = Handled(cudaStreamSynchronize(dev.stream));
      if (err != cudaSuccess && status_.ok()) {
        status_ = absl::InternalError(absl::StrCat(what_, ": waiting on ", dev.name, ": ",
                                                   CudaText(err)));
      }
    }
    for (const Dest& d : dests_) {
      if (d.end == nullptr || !wait(d.index, d.end)) continue;
      float ms = 0;
      if (Handled(cudaEventElapsedTime(&ms, d.start, d.end)) == cudaSuccess) {
        us_ = std::max(us_, 1e3 * static_cast<double>(ms));
      }
    }
    *us = us_;
    return status_;
  }

  // The blocks, queued. A failure stops the queueing; the caller then calls Finish, which waits
  // for what was queued.
  absl::Status Queue(int root, std::span<void* const> ptrs, uint64_t rows, uint64_t row_bytes,
                     std::span<const uint64_t> ends) {
    KeepCurrentDevice keep;
    const CudaCollectives::Device& from = owner_.devices_[root];
    const size_t chunks = ends.size();
    for (size_t i = 0; i < ptrs.size(); ++i) {
      if (static_cast<int>(i) == root || ptrs[i] == nullptr || ptrs[i] == ptrs[root]) continue;
      Dest d;
      d.index = static_cast<int>(i);
      d.arrival = std::shared_ptr<InputArrival>(
          new InputArrival{.rows = rows, .row_bytes = row_bytes},
          [ordinal = owner_.devices_[i].ordinal](InputArrival* a) {
            KeepCurrentDevice keep;
            Handled(cudaSetDevice(ordinal));
            for (void* e : a->events) Handled(cudaEventDestroy(static_cast<cudaEvent_t>(e)));
            delete a;
          });
      dests_.push_back(std::move(d));
    }
    auto fail = [&](const std::string& where, cudaError_t e) {
      return absl::InternalError(absl::StrCat(what_, ": ", where, ": ", CudaText(e)));
    };
    for (Dest& d : dests_) {
      const CudaCollectives::Device& to = owner_.devices_[d.index];
      if (cudaError_t e = Handled(cudaSetDevice(to.ordinal)); e != cudaSuccess)
        return fail("cudaSetDevice", e);
      for (size_t c = 0; c < chunks; ++c) {
        cudaEvent_t ev = nullptr;
        // Only the last chunk's event times the copy; the others are waits alone.
        const unsigned flags = c + 1 == chunks ? cudaEventDefault : cudaEventDisableTiming;
        if (cudaError_t e = Handled(cudaEventCreateWithFlags(&ev, flags)); e != cudaSuccess) {
          return fail("cudaEventCreate", e);
        }
        d.arrival->events.push_back(ev);
        d.arrival->ends.push_back(ends[c]);
      }
      d.end = static_cast<cudaEvent_t>(d.arrival->events.back());
      if (cudaError_t e = Handled(cudaEventCreate(&d.start)); e != cudaSuccess)
        return fail("cudaEventCreate", e);
      if (cudaError_t e = Handled(cudaEventRecord(d.start, to.stream)); e != cudaSuccess)
        return fail("cudaEventRecord", e);
    }
    for (size_t c = 0; c < chunks; ++c) {
      const uint64_t offset = c == 0 ? 0 : ends[c - 1], width = ends[c] - offset;
      // Each destination pulls on its own stream, so the copies run at once on their engines.
      for (const Dest& d : dests_) {
        const CudaCollectives::Device& to = owner_.devices_[d.index];
        cudaMemcpy3DPeerParms p{};
        p.srcPtr = make_cudaPitchedPtr(static_cast<char*>(ptrs[root]) + offset, row_bytes, width,
                                       rows);
        p.srcDevice = from.ordinal;
        p.dstPtr = make_cudaPitchedPtr(static_cast<char*>(ptrs[d.index]) + offset, row_bytes,
                                       width, rows);
        p.dstDevice = to.ordinal;
        p.extent = make_cudaExtent(width, rows, 1);
        cudaError_t e = Handled(cudaSetDevice(to.ordinal));
        if (e == cudaSuccess) e = Handled(cudaMemcpy3DPeerAsync(&p, to.stream));
        if (e != cudaSuccess) return fail(absl::StrCat("peer copy to ", to.name), e);
      }
      for (const Dest& d : dests_) {
        const CudaCollectives::Device& to = owner_.devices_[d.index];
        cudaError_t e = Handled(cudaSetDevice(to.ordinal));
        if (e == cudaSuccess) {
          e = Handled(cudaEventRecord(static_cast<cudaEvent_t>(d.arrival->events[c]), to.stream));
        }
        if (e != cudaSuccess) return fail(absl::StrCat("cudaEventRecord on ", to.name), e);
      }
    }
    queued_ = true;
    return absl::OkStatus();
  }

 private:
  CudaCollectives& owner_;
  const std::string what_;
  std::vector<Dest> dests_;
  bool queued_ = false;  // every block queued, each behind its event
  bool finished_ = false;
  absl::Status status_;
  double us_ = 0;
};

absl::StatusOr<std::unique_ptr<ArrivingBroadcast>> CudaCollectives::StartBroadcast(
    int root, std::span<void* const> ptrs, uint64_t rows, uint64_t row_bytes,
    std::span<const uint64_t> ends) {
  const uint64_t bytes = rows * row_bytes;
  bool every_device = false, any_target = false;
  RETURN_IF_ERROR(CheckReady(root, ptrs, bytes, &every_device, &any_target));
  bool blocks = !ends.empty() && ends.back() == row_bytes;
  for (size_t c = 0; c < ends.size(); ++c) blocks = blocks && ends[c] > (c == 0 ? 0 : ends[c - 1]);
  if (!blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(root, ptrs, bytes), ": column blocks must end in ascending order at ",
        row_bytes, " bytes, the row's length; got ", absl::StrJoin(ends, ", ")));
  }
  auto b = std::make_unique<CudaArrivingBroadcast>(*this, Describe(root, ptrs, bytes));
  if (!any_target) return b;
  absl::Status queued = b->Queue(root, ptrs, rows, row_bytes, ends);
  if (!queued.ok()) {
    double us = 0;
    (void)b->Finish(&us);  // none of the queued copies may still write when the caller frees
    return queued;
  }
  return b;
}

}  // namespace opserve::cuda_collectives_internal
