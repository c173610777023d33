// The node section's anchors, measured in this process before any server starts: the topology,
// each GPU's read stream and D2D copy, the peer copy between GPUs 0 and 1, and cuBLAS BF16 on
// one GPU's share of the sharded matmul. The contexts are reset at the end so the servers see
// the GPUs' whole memory.
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_device.h"
#include "bench/ceilings.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench::node_bench {
namespace {

// The anchors: a 4 GiB read stream and copy, a 1 GiB peer copy.
constexpr uint64_t kAnchorStreamBytes = 4 * kGiB;
constexpr uint64_t kPeerCopyBytes = kGiB;
constexpr int kAnchorReps = 20, kPeerReps = 7, kGemmReps = 10;

double MedianEventUs(cudaStream_t s, int warmups, int reps, const std::function<void()>& run) {
  for (int i = 0; i < warmups; ++i) run();
  Check(cudaStreamSynchronize(s), "warm-up");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "cudaEventCreate");
  Check(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    Check(cudaEventRecord(e0, s), "event");
    run();
    Check(cudaEventRecord(e1, s), "event");
    Check(cudaEventSynchronize(e1), "timed run");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return Percentile(us, 0.5);
}

}  // namespace

void Node::Anchors() {
  absl::PrintF("\ntopology (cudaDeviceCanAccessPeer; rank: cudaDevP2PAttrPerformanceRank)\n");
  for (int i = 0; i < gpus_; ++i) {
    cudaDeviceProp p{};
    Check(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties");
    absl::PrintF("  cuda:%d %s, %d SMs, %zu MiB, PCI %02x:%02x\n", i, p.name, p.multiProcessorCount,
                p.totalGlobalMem >> 20, p.pciBusID, p.pciDeviceID);
    if (i == 0) {
      rep_.device = absl::StrFormat("%d x %s (sm_%d%d, %zu MiB each)", gpus_, p.name, p.major,
                                    p.minor, p.totalGlobalMem >> 20);
    }
  }
  absl::PrintF("        ");
  for (int j = 0; j < gpus_; ++j) absl::PrintF(" %-12s", absl::StrCat("cuda:", j).c_str());
  absl::PrintF("\n");
  for (int i = 0; i < gpus_; ++i) {
    absl::PrintF("  cuda:%d", i);
    for (int j = 0; j < gpus_; ++j) {
      if (i == j) {
        absl::PrintF(" %-12s", "-");
        continue;
      }
      int can = 0, rank = 0;
      cudaDeviceCanAccessPeer(&can, i, j);
      cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, i, j);
      absl::PrintF(" %-12s", can ? absl::StrCat("peer r", rank).c_str() : "no peer");
    }
    absl::PrintF("\n");
  }

  // Each GPU's read stream and D2D copy over 4 GiB.
  for (int d = 0; d < gpus_; ++d) {
    Check(cudaSetDevice(d), "cudaSetDevice");
    cudaStream_t s;
    Check(cudaStreamCreate(&s), "cudaStreamCreate");
    {
      DeviceMem buf(kAnchorStreamBytes), sink(sizeof(float));
      Check(FillRandomF32(reinterpret_cast<float*>(buf.get()), kAnchorStreamBytes / 4, 17 + d, s),
            "fill");
      const double us = MedianEventUs(s, 3, kAnchorReps, [&] {
        Check(ReadStream(reinterpret_cast<const float*>(buf.get()), kAnchorStreamBytes / 4,
                         reinterpret_cast<float*>(sink.get()), s),
              "read stream");
      });
      stream_gbps_.push_back(kAnchorStreamBytes / us / 1e3);
      AddRow("ceiling", "4 GiB", "FLOAT32", absl::StrCat("read_stream cuda:", d), true, kAnchorReps,
             us, kAnchorStreamBytes, 0);
      const uint64_t half = kAnchorStreamBytes / 2;
      const double copy_us = MedianEventUs(s, 2, kAnchorReps, [&] {
        Check(CopyD2D(buf.get() + half, buf.get(), half, s), "D2D copy");
      });
      AddRow("ceiling", "2 GiB", "-", absl::StrCat("d2d_copy cuda:", d), true, kAnchorReps,
             copy_us, 2 * half, 0);
      if (d == 0) {
        rep_.stream_gbps = stream_gbps_[0];
        rep_.copy_gbps = 2 * half / copy_us / 1e3;
      }
      absl::PrintF("  cuda:%d read stream %.0f GB/s, D2D copy %.0f GB/s (read + written)\n", d,
                  stream_gbps_.back(), 2 * half / copy_us / 1e3);
    }
    Check(cudaStreamDestroy(s), "cudaStreamDestroy");
  }

  // The peer copy between GPUs 0 and 1, each way, with peer access on where the topology has it.
  if (gpus_ >= 2) {
    std::unique_ptr<DeviceMem> mem[2];
    for (int d = 0; d < 2; ++d) {
      Check(cudaSetDevice(d), "cudaSetDevice");
      int can = 0;
      cudaDeviceCanAccessPeer(&can, d, 1 - d);
      if (can) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) Check(e, "peer access");
        cudaGetLastError();
      }
      mem[d] = std::make_unique<DeviceMem>(kPeerCopyBytes);
      Check(FillRandomF32(reinterpret_cast<float*>(mem[d]->get()), kPeerCopyBytes / 4, 5 + d,
                          nullptr),
            "fill");
      Check(cudaDeviceSynchronize(), "fill");
    }
    for (int src = 0; src < 2; ++src) {
      const int dst = 1 - src;
      Check(cudaSetDevice(src), "cudaSetDevice");
      cudaStream_t s;
      Check(cudaStreamCreate(&s), "cudaStreamCreate");
      const double us = MedianEventUs(s, 2, kPeerReps, [&] {
        Check(cudaMemcpyPeerAsync(mem[dst]->get(), dst, mem[src]->get(), src, kPeerCopyBytes, s),
              "cudaMemcpyPeerAsync");
      });
      peer_gbps_[src] = kPeerCopyBytes / us / 1e3;
      AddRow("ceiling", "1 GiB", "-", absl::StrFormat("peer_copy cuda:%d->cuda:%d", src, dst), true,
             kPeerReps, us, kPeerCopyBytes, 0);
      absl::PrintF("  peer copy cuda:%d -> cuda:%d (cudaMemcpyPeerAsync 1 GiB, median of %d): %.1f GB/s\n",
                  src, dst, kPeerReps, peer_gbps_[src]);
      Check(cudaStreamDestroy(s), "cudaStreamDestroy");
    }
  }

  // cuBLAS BF16 on GPU 0: one GPU's share of the sharded matmul, and the cross-GPU matmul's shape.
  {
    Check(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t s;
    Check(cudaStreamCreate(&s), "cudaStreamCreate");
    auto blas_owner = std::make_unique<Blas>();  // destroyed before its stream
    Blas& blas = *blas_owner;
    Check(blas.Init(s), "cuBLAS init");
    auto gemm_us = [&](int64_t m, int64_t k, int64_t n) {
      DeviceMem a(m * k * 2), b(k * n * 2), c(m * n * 4);
      Check(FillRandomBf16(reinterpret_cast<uint16_t*>(a.get()), m * k, 3, s), "fill");
      Check(FillRandomBf16(reinterpret_cast<uint16_t*>(b.get()), k * n, 4, s), "fill");
      return MedianEventUs(s, 3, kGemmReps, [&] {
        Check(blas.Gemm(Blas::Precision::kBf16, a.get(), b.get(),
                        reinterpret_cast<float*>(c.get()), m, n, k),
              "cuBLAS BF16 GEMM");
      });
    };
    const int64_t share = (o_.smm_m + gpus_ - 1) / gpus_;  // the largest shard, as the server cuts
    share_us_ = gemm_us(share, o_.smm_k, o_.smm_n);
    const double flops = 2.0 * share * o_.smm_k * o_.smm_n;
    share_tflops_ = flops / share_us_ / 1e6;
    AddRow("ceiling", absl::StrFormat("%d x %d x %d", share, o_.smm_n, o_.smm_k), "BFLOAT16",
           "cublas_bf16 cuda:0 (one GPU's share)", true, kGemmReps, share_us_, 0,
           static_cast<uint64_t>(flops));
    mm_cublas_us_ = gemm_us(o_.mm, o_.mm, o_.mm);
    AddRow("ceiling", absl::StrFormat("%d x %d x %d", o_.mm, o_.mm, o_.mm), "BFLOAT16",
           "cublas_bf16 cuda:0", true, kGemmReps, mm_cublas_us_, 0,
           static_cast<uint64_t>(2.0 * o_.mm * o_.mm * o_.mm));
    absl::PrintF("  cuBLAS BF16 cuda:0: share %dx%dx%d %.1f us = %.0f TFLOP/s; %d^3 %.1f us\n",
                share, o_.smm_k, o_.smm_n, share_us_, share_tflops_, o_.mm, mm_cublas_us_);
    blas_owner.reset();
    Check(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
  // Give the GPUs back whole: the servers size their budgets from the free memory they find.
  for (int d = 0; d < gpus_; ++d) {
    Check(cudaSetDevice(d), "cudaSetDevice");
    Check(cudaDeviceReset(), "cudaDeviceReset");
  }
}

}  // namespace opserve::bench::node_bench
