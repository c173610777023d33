// Node sections 2-4 and the tensor over one device's budget: graphs whose tensors live on
// several devices. A matmul with its inputs on two GPUs against the same on one, a sharded
// row_mean and a sharded BF16 matmul against N x their one-GPU anchors, and a sharded tensor of
// 1.5 x one device's budget that an unsharded put must refuse.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench::node_bench {
namespace {

// ---- Timing and checking a matmul (sections 2 and 4). ----

// The server's time for a request: compute_us + peer_copy_us (RequestTiming); and total_us, from
// the handler's receipt to the response, for a request whose copies overlap its compute.
struct Timed {
  std::vector<double> us, peer_us, total_us;
  uint64_t peer_bytes = 0;
  std::string device;
};

std::string TimeExecute(client::Client& c, const v1::ExecuteRequest& req, Timed& into) {
  auto resp = c.Execute(req);
  if (!resp.ok()) return StatusText(resp.status());
  into.us.push_back(resp->timing().compute_us() + resp->timing().peer_copy_us());
  into.peer_us.push_back(resp->timing().peer_copy_us());
  into.total_us.push_back(resp->timing().total_us());
  into.peer_bytes = resp->peer_copy_bytes();
  into.device = resp->device();
  return "";
}

// C[i][j] of A (m x k) B (k x n) drawn from `a` and `b`, in double; *abs gets sum |a b|.
double RefDot(const Gen& a, const Gen& b, int64_t i, int64_t j, double* abs) {
  double s = 0, x = 0;
  for (int64_t p = 0; p < a.cols; ++p) {
    const double v = static_cast<double>(a.At(i * a.cols + p)) * b.At(p * b.cols + j);
    s += v;
    x += std::fabs(v);
  }
  *abs = x;
  return s;
}

// Reads the stored C (FLOAT32 m x n) back and checks 64 entries against the host; "" when right.
std::string CheckMatmul(NodeServer& s, const std::string& name, const Gen& a, const Gen& b) {
  const int64_t m = a.rows, n = b.cols;
  std::map<uint64_t, std::pair<int64_t, int64_t>> at;  // byte offset -> (i, j)
  for (int k = 0; k < 64; ++k) {
    const int64_t i = k == 0 ? 0 : k == 1 ? m - 1 : static_cast<int64_t>(Mix(k) % m);
    const int64_t j = k == 0 ? 0 : k == 1 ? n - 1 : static_cast<int64_t>(Mix(k + 1000) % n);
    at[4 * static_cast<uint64_t>(i * n + j)] = {i, j};
  }
  std::map<uint64_t, float> got;
  v1::TensorInfo info;
  uint64_t bytes = 0;
  grpc::Status st = ReadTensor(
      *s.stub, name,
      [&](uint64_t off, const std::string& chunk) {
        for (auto it = at.lower_bound(off); it != at.end() && it->first + 4 <= off + chunk.size();
             ++it) {
          float v;
          std::memcpy(&v, chunk.data() + (it->first - off), 4);
          got[it->first] = v;
        }
      },
      &info, &bytes);
  if (!st.ok()) return absl::StrCat("GetTensor ", name, ": ", StatusText(st));
  if (bytes != static_cast<uint64_t>(m * n * 4)) {
    return absl::StrCat("GetTensor ", name, ": ", bytes, " bytes, want ", m * n * 4);
  }
  for (const auto& [off, ij] : at) {
    double abs = 0;
    const double want = RefDot(a, b, ij.first, ij.second, &abs);
    const auto g = got.find(off);
    if (g == got.end()) return absl::StrCat(name, ": entry ", off / 4, " straddles two chunks");
    if (!(std::fabs(g->second - want) <= 1e-3 * abs + 1e-6)) {
      return absl::StrFormat("%s[%d, %d] = %.6g, want %.6g", name, ij.first, ij.second, g->second,
                             want);
    }
  }
  return "";
}

}  // namespace

// ---- 2. A matmul across GPUs. ----

std::string Node::Cross(NodeServer& multi) {
  if (n_ < 2) return "needs two devices";
  const Gen a{v1::BFLOAT16, o_.mm, o_.mm, 301}, b{v1::BFLOAT16, o_.mm, o_.mm, 302};
  const std::string d0 = multi.devices[0], d1 = multi.devices[1];
  struct Put {
    const char* name;
    const Gen& g;
    std::string device;
  };
  for (const Put& p : {Put{"mm_a", a, d0}, Put{"mm_b0", b, d0}, Put{"mm_b1", b, d1}}) {
    PutOutcome r = PutGen(*multi.stub, p.name, p.g, p.device, false, false, Threads());
    if (!r.status.ok()) return absl::StrCat("PutTensor ", p.name, ": ", StatusText(r.status));
  }
  const v1::ExecuteRequest same = MatmulStored("mm_a", "mm_b0", "mm_c");
  const v1::ExecuteRequest cross = MatmulStored("mm_a", "mm_b1", "mm_c");
  Timed t_same, t_cross;
  for (int i = 0; i < 2; ++i) {  // warm-up: cuBLAS's first calls, the peer mappings
    Timed w;
    if (std::string e = TimeExecute(multi.c(), same, w); !e.empty()) return "same-device: " + e;
    if (std::string e = TimeExecute(multi.c(), cross, w); !e.empty()) return "cross-device: " + e;
  }
  for (int i = 0; i < o_.reps; ++i) {  // interleaved, so clock drift reaches both alike
    if (std::string e = TimeExecute(multi.c(), same, t_same); !e.empty()) return e;
    if (std::string e = TimeExecute(multi.c(), cross, t_cross); !e.empty()) return e;
  }
  if (std::string e = CheckMatmul(multi, "mm_c", a, b); !e.empty()) return "cross-device C: " + e;
  // End to end on the server, as for the sharded matmul: B's copy runs beside the GEMM.
  const double same_us = Percentile(t_same.total_us, 0.5);
  const double cross_us = Percentile(t_cross.total_us, 0.5);
  const double peer_us = Percentile(t_cross.peer_us, 0.5);
  const uint64_t b_bytes = b.Bytes();
  // The copy goes to where the graph ran, from the other device.
  const int src = t_cross.device == d1 ? 0 : 1;
  const double bw = peer_gbps_[src];
  const double allowed = same_us + b_bytes / (kPeerShare * bw * 1e3);
  const double flops = 2.0 * o_.mm * o_.mm * o_.mm;
  const std::string shape = absl::StrFormat("%d x %d x %d", o_.mm, o_.mm, o_.mm);
  AddRow("node", shape, "BFLOAT16", absl::StrCat("matmul both on ", d0, " (server)"), false,
         o_.reps, same_us, 0, static_cast<uint64_t>(flops), "cublas_bf16 cuda:0",
         mm_cublas_us_ > 0 ? mm_cublas_us_ / same_us : 0);
  AddRow("node", shape, "BFLOAT16", absl::StrCat("matmul A on ", d0, ", B on ", d1, " (server)"),
         false, o_.reps, cross_us, 0, static_cast<uint64_t>(flops));
  absl::PrintF("  same device: %.1f us (cuBLAS alone %.1f us); across: %.1f us on %s, B's "
              "copy beside the GEMM %.1f us for %llu bytes (%.1f GB/s as the server reports it)\n",
              same_us, mm_cublas_us_, cross_us, t_cross.device.c_str(), peer_us,
              static_cast<unsigned long long>(t_cross.peer_bytes),
              peer_us > 0 ? t_cross.peer_bytes / peer_us / 1e3 : 0.0);
  if (bw > 0) {
    absl::PrintF("  predicted across: %.1f + B's first eighth (%llu B) at the peer copy's %.1f "
                "GB/s (this process, cudaMemcpyPeerAsync cuda:%d->%d) = %.1f us, the rest of B "
                "landing beside the GEMM; target allows %.1f us (at 0.8x)\n",
                same_us, static_cast<unsigned long long>(b_bytes / 8), bw, src, 1 - src,
                same_us + b_bytes / 8 / (bw * 1e3), allowed);
  }
  const bool copied = t_cross.peer_bytes == b_bytes;
  Perf(absl::StrFormat("node cross-GPU: matmul %s A/B on 2 GPUs <= same-GPU + B at %.1fx peer "
                       "copy",
                       shape, kPeerShare),
       absl::StrFormat("%.1f us vs %.1f + %.1f = %.1f us (peer %.0f GB/s measured here)", cross_us,
                       same_us, allowed - same_us, allowed, bw) +
           (copied ? "" : absl::StrCat("; peer_copy_bytes ", t_cross.peer_bytes, ", want ", b_bytes)),
       cross_us <= allowed && copied);
  for (const char* t : {"mm_a", "mm_b0", "mm_b1", "mm_c"}) (void)multi.c().DeleteTensor(t);
  return "";
}

// ---- 3. The sharded row_mean. ----

std::string Node::ShardedRowMean(NodeServer& multi) {
  const Gen x{v1::FLOAT32, o_.rm_rows, o_.rm_cols, 401};
  PutOutcome p = PutGen(*multi.stub, "rm_x", x, "", true, true, Threads());
  if (!p.status.ok()) return absl::StrCat("PutTensor (sharded) ", x.Shape(), ": ", StatusText(p.status));
  absl::PrintF("  put %s sharded (%.2f GiB) in %.1f s = %.2f GB/s; on %s in %d shards\n",
              x.Shape().c_str(), x.Bytes() / double(kGiB), p.seconds, x.Bytes() / p.seconds / 1e9,
              p.info.device().c_str(), p.info.shards_size());
  v1::ExecuteRequest req = RowMeanOfStored("rm_x");
  std::vector<double> kernel_us, compute_us;
  uint64_t bytes = 0;
  int node_results = 0;
  std::string ran_on, check;
  for (int i = 0; i < o_.reps + 1; ++i) {
    auto resp = multi.c().Execute(req);
    if (!resp.ok()) return absl::StrCat("Execute row_mean: ", StatusText(resp.status()));
    if (resp->nodes_size() < 1 || resp->outputs_size() != 1) return "row_mean: no node or output";
    if (i == 0) {  // the first is the warm-up, and the one checked
      check = CheckRowMeans(resp->outputs(0).tensor().data(), p.row_sum, p.row_abs, x.cols);
      continue;
    }
    // One node result (the shards' kernels as one node), or one per shard: then the slowest
    // shard's time over all the shards' bytes.
    double k = 0;
    bytes = 0;
    for (const v1::NodeResult& r : resp->nodes()) {
      k = std::max(k, r.kernel_us());
      bytes += r.bytes();
    }
    kernel_us.push_back(k);
    compute_us.push_back(resp->timing().compute_us());
    ran_on = resp->device();
    node_results = resp->nodes_size();
  }
  if (!check.empty()) return check;
  const double k_us = Percentile(kernel_us, 0.5), c_us = Percentile(compute_us, 0.5);
  double sum_stream = 0;
  for (int i = 0; i < n_ && i < static_cast<int>(stream_gbps_.size()); ++i) sum_stream += stream_gbps_[i];
  const double ceiling = n_ * (stream_gbps_.empty() ? 0 : stream_gbps_[0]);
  const double gbps = bytes / k_us / 1e3;
  AddRow("node", absl::StrCat(x.Shape(), " sharded x", p.info.shards_size()), "FLOAT32",
         absl::StrCat("row_mean kernel_us (server) on ", ran_on), false, o_.reps, k_us, bytes, 0,
         "N x read_stream cuda:0", ceiling > 0 ? gbps / ceiling : 0);
  AddRow("node", absl::StrCat(x.Shape(), " sharded x", p.info.shards_size()), "FLOAT32",
         "row_mean compute_us (server)", false, o_.reps, c_us, bytes, 0);
  if (node_results > 1) absl::PrintF("  (%d node results: one per shard)\n", node_results);
  absl::PrintF("  row_mean on %s: kernel %.1f us = %.0f GB/s, compute %.1f us = %.0f GB/s (%llu "
              "bytes); predicted at N x read stream (%d x %.0f GB/s; sum over GPUs %.0f): %.1f us\n",
              ran_on.c_str(), k_us, gbps, c_us, bytes / c_us / 1e3,
              static_cast<unsigned long long>(bytes), n_,
              stream_gbps_.empty() ? 0.0 : stream_gbps_[0], sum_stream,
              ceiling > 0 ? bytes / ceiling / 1e3 : 0.0);
  Perf(absl::StrFormat("node sharded: row_mean %s over %d devices >= %.1fx N x read stream",
                       x.Shape(), n_, kStreamShare),
       absl::StrFormat("%.0f GB/s (kernel_us) vs %d x %.0f = %.0f GB/s: %.3fx", gbps, n_,
                       stream_gbps_.empty() ? 0.0 : stream_gbps_[0], ceiling,
                       ceiling > 0 ? gbps / ceiling : 0),
       gbps >= kStreamShare * ceiling && p.info.shards_size() == n_);
  (void)multi.c().DeleteTensor("rm_x");
  return "";
}

// ---- 4. The sharded matmul. ----

std::string Node::ShardedMatmul(NodeServer& multi) {
  const Gen a{v1::BFLOAT16, o_.smm_m, o_.smm_k, 501}, b{v1::BFLOAT16, o_.smm_k, o_.smm_n, 502};
  PutOutcome pa = PutGen(*multi.stub, "smm_a", a, "", true, false, Threads());
  if (!pa.status.ok()) return absl::StrCat("PutTensor A (sharded): ", StatusText(pa.status));
  PutOutcome pb = PutGen(*multi.stub, "smm_b", b, multi.devices[0], false, false, Threads());
  if (!pb.status.ok()) return absl::StrCat("PutTensor B: ", StatusText(pb.status));
  // One device's share through the server too, for comparison: the first shard's rows.
  const int64_t share = (o_.smm_m + n_ - 1) / n_;
  const Gen a_share{v1::BFLOAT16, share, o_.smm_k, 501};  // A's first rows, the same values
  PutOutcome ps = PutGen(*multi.stub, "smm_a0", a_share, multi.devices[0], false, false, Threads());
  if (!ps.status.ok()) return absl::StrCat("PutTensor A's share: ", StatusText(ps.status));
  const v1::ExecuteRequest sharded = MatmulStored("smm_a", "smm_b", "smm_c");
  const v1::ExecuteRequest one = MatmulStored("smm_a0", "smm_b", "smm_c0");
  Timed t_sh, t_one;
  std::vector<double> total_us;
  for (int i = 0; i < 2; ++i) {
    Timed w;
    if (std::string e = TimeExecute(multi.c(), sharded, w); !e.empty()) return "sharded: " + e;
    if (std::string e = TimeExecute(multi.c(), one, w); !e.empty()) return "one device: " + e;
  }
  for (int i = 0; i < o_.reps; ++i) {
    if (std::string e = TimeExecute(multi.c(), sharded, t_sh); !e.empty()) return e;
    if (std::string e = TimeExecute(multi.c(), one, t_one); !e.empty()) return e;
  }
  if (std::string e = CheckMatmul(multi, "smm_c", a, b); !e.empty()) return "sharded C: " + e;
  const double flops = 2.0 * o_.smm_m * o_.smm_k * o_.smm_n;
  // End to end on the server: B's broadcast runs beside the GEMMs, so compute + copy would count
  // the overlap twice.
  const double sh_us = Percentile(t_sh.total_us, 0.5), one_us = Percentile(t_one.total_us, 0.5);
  const double tflops = flops / sh_us / 1e6;
  const double share_flops = 2.0 * share * o_.smm_k * o_.smm_n;
  const std::string shape = absl::StrFormat("%d x %d x %d", o_.smm_m, o_.smm_n, o_.smm_k);
  AddRow("node", shape + absl::StrCat(" A sharded x", n_), "BFLOAT16",
         absl::StrCat("matmul sharded (server) on ", t_sh.device), false, o_.reps, sh_us, 0,
         static_cast<uint64_t>(flops), "N x cublas share",
         share_tflops_ > 0 ? tflops / (n_ * share_tflops_) : 0);
  AddRow("node", absl::StrFormat("%d x %d x %d", share, o_.smm_n, o_.smm_k), "BFLOAT16",
         absl::StrCat("matmul one share (server) on ", t_one.device), false, o_.reps, one_us, 0,
         static_cast<uint64_t>(share_flops));
  const double b_bytes = static_cast<double>(b.Bytes()) * (n_ - 1);
  absl::PrintF("  sharded on %s: %.1f us (total; B's broadcast beside the GEMMs: %.1f us for %llu bytes) = %.1f "
              "TFLOP/s; one share via the server %.1f us = %.1f TFLOP/s; cuBLAS share %.1f us = "
              "%.1f TFLOP/s\n",
              t_sh.device.c_str(), sh_us, Percentile(t_sh.peer_us, 0.5),
              static_cast<unsigned long long>(t_sh.peer_bytes), tflops, one_us,
              share_flops / one_us / 1e6, share_us_, share_tflops_);
  if (!cpu_ && peer_gbps_[0] > 0) {
    // B arrives in two blocks of columns, the first an eighth of them, and the GEMM of each block
    // waits for its own: the first block is the wait, the second's copy hides behind the first's
    // GEMM.
    const double first_chunk_us = b_bytes / 8 / (peer_gbps_[0] * 1e3);
    absl::PrintF("  predicted: B's first block %.0f bytes at %.1f GB/s + the share's GEMM %.1f us "
                "= %.1f us (the rest of B lands while the first block's GEMM runs) -> %.1f "
                "TFLOP/s\n",
                b_bytes / 8, peer_gbps_[0], share_us_, first_chunk_us + share_us_,
                flops / (first_chunk_us + share_us_) / 1e6);
  }
  Perf(absl::StrFormat("node sharded: matmul BF16 %s (A over %d GPUs) >= %.2fx N x cuBLAS share",
                       shape, n_, kGemmShare),
       absl::StrFormat("%.1f TFLOP/s vs %d x %.1f = %.1f: %.3fx", tflops, n_, share_tflops_,
                       n_ * share_tflops_,
                       share_tflops_ > 0 ? tflops / (n_ * share_tflops_) : 0),
       tflops >= kGemmShare * n_ * share_tflops_);
  for (const char* t : {"smm_a", "smm_b", "smm_a0", "smm_c", "smm_c0"}) (void)multi.c().DeleteTensor(t);
  return "";
}

// ---- 3b. A tensor larger than one device's budget. ----

std::string Node::Big() {
  if (o_.big_budget == 0) return "";
  const std::string devs = cpu_ ? "--device=cpu:2" : "--device=cuda:0,1";
  const uint64_t budget = static_cast<uint64_t>(o_.big_budget);
  NodeServer s;
  if (std::string err = s.Open(launch_.bin(),
                               Args({devs, absl::StrCat(flags_.budget, "=", budget)}), 0);
      !err.empty()) {
    return err;
  }
  if (s.devices.size() != 2) return absl::StrCat("want 2 devices, got ", absl::StrJoin(s.devices, ", "));
  const int64_t cols = o_.big_cols;
  const int64_t rows = static_cast<int64_t>((budget * 3 / 2 + cols * 4 - 1) / (cols * 4));
  const Gen x{v1::FLOAT32, rows, cols, 701};
  absl::PrintF("  %s %llu bytes per device; the tensor %s FLOAT32 = %.2f GiB (%.2fx the budget)\n",
              flags_.budget.c_str(), static_cast<unsigned long long>(budget), x.Shape().c_str(),
              x.Bytes() / double(kGiB), double(x.Bytes()) / budget);
  // Unsharded: it fits no device.
  const auto t0 = Clock::now();
  PutOutcome whole = PutGen(*s.stub, "big_whole", x, "", false, false, Threads());
  const double refuse_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const bool refused = whole.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                       absl::StrContains(absl::AsciiStrToLower(whole.status.error_message()), "budget");
  absl::PrintF("  unsharded put: %s (after %.2f s)\n", StatusText(whole.status).c_str(), refuse_s);
  const std::string where = cpu_ ? " (cpu)" : "";
  Correct(absl::StrCat("node over budget", where, ": unsharded put of 1.5x budget answers "
                                                  "RESOURCE_EXHAUSTED naming the budget"),
          StatusText(whole.status), refused);
  // Sharded: half on each device.
  PutOutcome p = PutGen(*s.stub, "big_x", x, "", true, true, Threads());
  std::string problem;
  if (!p.status.ok()) problem = absl::StrCat("sharded put: ", StatusText(p.status));
  uint64_t largest = 0;
  for (const v1::TensorShard& sh : p.info.shards()) largest = std::max<uint64_t>(largest, sh.bytes());
  if (problem.empty() && (p.info.shards_size() != 2 || largest > budget)) {
    problem = absl::StrCat("sharded put gave ", p.info.ShortDebugString());
  }
  double reduce_us = 0, get_s = 0;
  SpotCheck spot;
  if (problem.empty()) {
    absl::PrintF("  sharded put in %.1f s = %.2f GB/s, on %s\n", p.seconds,
                x.Bytes() / p.seconds / 1e9, p.info.device().c_str());
    auto resp = s.c().Execute(RowMeanOfStored("big_x"));
    if (!resp.ok()) {
      problem = absl::StrCat("row_mean: ", StatusText(resp.status()));
    } else if (resp->outputs_size() != 1) {
      problem = "row_mean: no output";
    } else {
      reduce_us = resp->timing().compute_us();
      problem = CheckRowMeans(resp->outputs(0).tensor().data(), p.row_sum, p.row_abs, cols);
    }
  }
  if (problem.empty()) {
    v1::TensorInfo info;
    uint64_t bytes = 0;
    const auto g0 = Clock::now();
    grpc::Status st = ReadTensor(
        *s.stub, "big_x", [&](uint64_t off, const std::string& c) { spot.Chunk(x, off, c); }, &info,
        &bytes);
    get_s = std::chrono::duration<double>(Clock::now() - g0).count();
    if (!st.ok()) {
      problem = absl::StrCat("GetTensor: ", StatusText(st));
    } else if (bytes != x.Bytes()) {
      problem = absl::StrCat("GetTensor returned ", bytes, " bytes, want ", x.Bytes());
    } else if (spot.wrong > 0) {
      problem = absl::StrCat("GetTensor: ", spot.wrong, " of ", spot.checked,
                             " sampled elements wrong, first at ", spot.first_wrong);
    }
  }
  if (problem.empty()) {
    absl::PrintF("  row_mean %.1f us (compute), row means checked; GetTensor %.1f s = %.2f GB/s, "
                "%llu elements spot-checked\n",
                reduce_us, get_s, x.Bytes() / get_s / 1e9,
                static_cast<unsigned long long>(spot.checked));
  }
  Correct(absl::StrCat("node over budget", where, ": sharded 1.5x-budget tensor stored, reduced "
                                                  "right, read back"),
          problem.empty() ? absl::StrFormat("%.2f GiB on %s; %d row means right; %d elements "
                                            "spot-checked",
                                            x.Bytes() / double(kGiB), p.info.device(), rows,
                                            spot.checked)
                          : problem,
          problem.empty());
  (void)s.c().DeleteTensor("big_x");
  return "";
}

}  // namespace opserve::bench::node_bench
