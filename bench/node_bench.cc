// The node section (node_bench.h): one opserve serving every device of a node. The anchors are
// measured in this process first (topology, read stream and D2D copy on each GPU, the peer copy
// between GPUs 0 and 1, cuBLAS BF16 on one GPU's share of the sharded matmul), its contexts are
// then reset so the servers see the GPUs' whole memory, and the sections drive real servers over
// loopback gRPC. Upload data is drawn from a counter hash of (seed, element index), so a chunk can
// be made, and a read-back checked, anywhere without holding the tensor in host memory.
#include "bench/node_bench.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench.h"
#include "bench/bench_device.h"
#include "bench/ceilings.h"
#include "bench/harness.h"
#include "bench/service_process.h"

namespace opserve::bench {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
// Upload chunks as the client library sends them: under gRPC's default 4 MiB receive limit.
constexpr uint64_t kChunkBytes = client::kDefaultChunkBytes;
constexpr uint32_t kReadChunkBytes = 4u << 20;
// The anchors: a 4 GiB read stream and copy (as GPU.md's), a 1 GiB peer copy.
constexpr uint64_t kAnchorStreamBytes = 4 * kGiB;
constexpr uint64_t kPeerCopyBytes = kGiB;
constexpr int kAnchorReps = 20, kPeerReps = 7, kGemmReps = 10;
// Targets (the brief of this section; node_bench.h).
constexpr double kStoredScaling = 0.95, kTinyScaling = 0.90, kPeerShare = 0.8, kStreamShare = 0.9,
                 kGemmShare = 0.85;
// A channel of its own per client group: gRPC would otherwise share one connection.
constexpr char kOwnSubchannelPool[] = "grpc.use_local_subchannel_pool";

// ---- Deterministic values: fresh random-looking floats in [-1, 1), never zero. ----

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float ValueAt(uint64_t seed, uint64_t i) {
  const float v = static_cast<float>(Mix(seed * 0xD1B54A32D192ED03ull + i) >> 40) *
                      (2.0f / 16777216.0f) -
                  1.0f;
  return v == 0.0f ? 0.5f : v;
}

uint16_t Bf16Bits(float f) {  // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16Float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A tensor the bench uploads: its values are ValueAt(seed, index), as BF16 where it is one.
struct Gen {
  v1::DType dtype = v1::FLOAT32;
  int64_t rows = 0, cols = 0;
  uint64_t seed = 1;
  int ElemBytes() const { return dtype == v1::BFLOAT16 ? 2 : 4; }
  uint64_t Elems() const { return static_cast<uint64_t>(rows) * cols; }
  uint64_t Bytes() const { return Elems() * ElemBytes(); }
  float At(uint64_t i) const {
    const float v = ValueAt(seed, i);
    return dtype == v1::BFLOAT16 ? Bf16Float(Bf16Bits(v)) : v;
  }
  std::string Shape() const { return absl::StrCat(rows, "x", cols); }
};

// Elements [e0, e1) of `g` as bytes; with `sums`, each row touched gets (row, sum, sum of |x|).
struct RowPart {
  int64_t row;
  double sum, abs;
};
std::string Draw(const Gen& g, uint64_t e0, uint64_t e1, std::vector<RowPart>* sums) {
  std::string out((e1 - e0) * g.ElemBytes(), '\0');
  if (g.dtype == v1::BFLOAT16) {
    auto* p = reinterpret_cast<uint16_t*>(out.data());
    for (uint64_t i = e0; i < e1; ++i) p[i - e0] = Bf16Bits(ValueAt(g.seed, i));
    return out;
  }
  auto* p = reinterpret_cast<float*>(out.data());
  for (uint64_t i = e0; i < e1;) {
    const int64_t row = static_cast<int64_t>(i / g.cols);
    const uint64_t end = std::min<uint64_t>(e1, static_cast<uint64_t>(row + 1) * g.cols);
    double s = 0, a = 0;
    for (; i < end; ++i) {
      const float v = ValueAt(g.seed, i);
      p[i - e0] = v;
      s += v;
      a += std::fabs(v);
    }
    if (sums != nullptr) sums->push_back({row, s, a});
  }
  return out;
}

int GenThreads(int asked) {
  if (asked > 0) return asked;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 16);
}

// ---- Transfers through the generated stub: PutTensorHeader's device and shard, and chunks made
// as they are sent. ----

struct PutOutcome {
  grpc::Status status;
  v1::TensorInfo info;
  double seconds = 0;
  std::vector<double> row_sum, row_abs;  // with row sums asked for (FLOAT32)
};

// Streams `g` to the server as `name`: chunks drawn by `threads` threads ahead of the one
// writer, in order, at most two per thread in memory at once (a tensor larger than host memory
// streams as well as a small one).
PutOutcome PutGen(v1::OpServe::Stub& stub, const std::string& name, const Gen& g,
                  const std::string& device, bool shard, bool row_sums, int threads) {
  PutOutcome out;
  if (row_sums) {
    out.row_sum.assign(g.rows, 0);
    out.row_abs.assign(g.rows, 0);
  }
  const uint64_t chunk_elems = kChunkBytes / g.ElemBytes();
  const uint64_t chunks = (g.Elems() + chunk_elems - 1) / chunk_elems;
  threads = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(threads, chunks)));
  const size_t slots = 2 * static_cast<size_t>(threads);
  struct Slot {
    int64_t chunk = -1;
    std::string bytes;
    std::vector<RowPart> parts;
  };
  std::vector<Slot> ring(slots);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t consumed = 0;
  bool stop = false;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (uint64_t c = t; c < chunks; c += threads) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || c < consumed + slots; });
          if (stop) return;
        }
        std::vector<RowPart> parts;
        const uint64_t e0 = c * chunk_elems, e1 = std::min(g.Elems(), e0 + chunk_elems);
        std::string bytes = Draw(g, e0, e1, row_sums ? &parts : nullptr);
        std::lock_guard<std::mutex> lock(mu);
        Slot& s = ring[c % slots];
        s.chunk = static_cast<int64_t>(c);
        s.bytes = std::move(bytes);
        s.parts = std::move(parts);
        cv.notify_all();
      }
    });
  }
  grpc::ClientContext context;
  v1::PutTensorResponse response;
  const auto t0 = Clock::now();
  std::unique_ptr<grpc::ClientWriter<v1::PutTensorRequest>> writer =
      stub.PutTensor(&context, &response);
  v1::PutTensorRequest header;
  v1::PutTensorHeader* h = header.mutable_header();
  h->set_name(name);
  h->set_dtype(g.dtype);
  h->add_shape(g.rows);
  h->add_shape(g.cols);
  h->set_overwrite(true);
  h->set_device(device);
  h->set_shard(shard);
  // A failed write means the server ended the call (a refusal): Finish says why.
  bool sent = writer->Write(header);
  for (uint64_t c = 0; sent && c < chunks; ++c) {
    v1::PutTensorRequest msg;
    std::vector<RowPart> parts;
    {
      std::unique_lock<std::mutex> lock(mu);
      Slot& s = ring[c % slots];
      cv.wait(lock, [&] { return s.chunk == static_cast<int64_t>(c); });
      msg.set_chunk(std::move(s.bytes));
      parts = std::move(s.parts);
      s.chunk = -1;
      consumed = c + 1;
      cv.notify_all();
    }
    for (const RowPart& p : parts) {
      out.row_sum[p.row] += p.sum;
      out.row_abs[p.row] += p.abs;
    }
    sent = writer->Write(msg);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  }
  for (std::thread& t : pool) t.join();
  if (sent) writer->WritesDone();
  out.status = writer->Finish();
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.info = response.info();
  return out;
}

// GetTensor `name` in chunks handed to `on_chunk(byte offset, bytes)` as they arrive.
grpc::Status ReadTensor(v1::OpServe::Stub& stub, const std::string& name,
                        const std::function<void(uint64_t, const std::string&)>& on_chunk,
                        v1::TensorInfo* info, uint64_t* bytes) {
  grpc::ClientContext context;
  v1::GetTensorRequest req;
  req.set_name(name);
  req.set_chunk_bytes(kReadChunkBytes);
  std::unique_ptr<grpc::ClientReader<v1::GetTensorResponse>> reader = stub.GetTensor(&context, req);
  v1::GetTensorResponse msg;
  *bytes = 0;
  while (reader->Read(&msg)) {
    if (msg.has_info()) {
      *info = msg.info();
      continue;
    }
    on_chunk(*bytes, msg.chunk());
    *bytes += msg.chunk().size();
  }
  return reader->Finish();
}

// Spot-checks of a read-back against the generator: in each chunk, its first and last 16
// elements and 16 more spread over it.
struct SpotCheck {
  uint64_t checked = 0, wrong = 0;
  int64_t first_wrong = -1;
  void Chunk(const Gen& g, uint64_t offset, const std::string& bytes) {
    const int es = g.ElemBytes();
    const uint64_t first = (offset + es - 1) / es, end = (offset + bytes.size()) / es;
    if (end <= first) return;
    const uint64_t n = end - first;
    auto check = [&](uint64_t k) {
      const uint64_t i = first + k;
      const char* p = bytes.data() + (i * es - offset);
      float got;
      if (es == 2) {
        uint16_t b;
        std::memcpy(&b, p, 2);
        got = Bf16Float(b);
      } else {
        std::memcpy(&got, p, 4);
      }
      ++checked;
      if (got != g.At(i)) {
        if (first_wrong < 0) first_wrong = static_cast<int64_t>(i);
        ++wrong;
      }
    };
    for (uint64_t k = 0; k < std::min<uint64_t>(16, n); ++k) check(k);
    for (uint64_t k = std::max<uint64_t>(16, n - std::min<uint64_t>(16, n)); k < n; ++k) check(k);
    for (uint64_t s = 0; s < 16 && n > 32; ++s) check(16 + Mix(offset + s) % (n - 32));
  }
};

// ---- Requests. ----

v1::ExecuteRequest TinyRowMean(const Gen& g) {
  v1::ExecuteRequest req;
  v1::Node* node = req.add_nodes();
  node->set_id("m");
  node->set_op("row_mean");
  node->set_algorithm("auto");
  node->add_inputs()->set_inline_name("x");
  v1::Tensor& t = (*req.mutable_inline_tensors())["x"];
  t.set_dtype(g.dtype);
  t.add_shape(g.rows);
  t.add_shape(g.cols);
  t.set_data(Draw(g, 0, g.Elems(), nullptr));
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("m");
  out->set_return_inline(true);
  return req;
}

v1::ExecuteRequest MatmulStored(const std::string& a, const std::string& b,
                                const std::string& store_as) {
  v1::ExecuteRequest req;
  v1::Node* node = req.add_nodes();
  node->set_id("c");
  node->set_op("matmul");
  node->set_algorithm("auto");
  node->add_inputs()->set_stored(a);
  node->add_inputs()->set_stored(b);
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("c");
  out->set_store_as(store_as);
  out->set_overwrite(true);
  return req;
}

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}
std::string StatusText(const grpc::Status& s) {
  return StatusText(client::ToAbslStatus(s));
}

// Row means in `data` against sums drawn with the data; a line on the first wrong row, or "".
std::string CheckRowMeans(const std::string& data, const std::vector<double>& sum,
                          const std::vector<double>& abs, int64_t cols) {
  if (data.size() != sum.size() * sizeof(float)) {
    return absl::StrCat("row_mean returned ", data.size(), " bytes, want ", sum.size() * 4);
  }
  const auto* got = reinterpret_cast<const float*>(data.data());
  int64_t wrong = 0, first = -1;
  for (size_t r = 0; r < sum.size(); ++r) {
    const double want = sum[r] / cols;
    // FP32 accumulation over a row in any order stays far inside this; a wrong or missing row
    // misses it by orders of magnitude.
    if (!(std::fabs(got[r] - want) <= 1e-5 * abs[r] / cols + 1e-7)) {
      if (first < 0) first = static_cast<int64_t>(r);
      ++wrong;
    }
  }
  if (wrong == 0) return "";
  return absl::StrFormat("%d of %d row means wrong, first row %d: %.7g, want %.7g", wrong,
                         sum.size(), first, got[first], sum[first] / cols);
}

// ---- Driving clients for a fixed time. ----

struct Tally {
  int64_t ok = 0;
  std::vector<double> latency_us, compute_us, kernel_us;
  std::map<std::string, int64_t> devices;  // ExecuteResponse.device
  int64_t misplaced = 0;                   // ran elsewhere than its stored input's device
  std::string error;
  void Merge(Tally&& o) {
    ok += o.ok;
    latency_us.insert(latency_us.end(), o.latency_us.begin(), o.latency_us.end());
    compute_us.insert(compute_us.end(), o.compute_us.begin(), o.compute_us.end());
    kernel_us.insert(kernel_us.end(), o.kernel_us.begin(), o.kernel_us.end());
    for (const auto& [d, n] : o.devices) devices[d] += n;
    misplaced += o.misplaced;
    if (error.empty()) error = std::move(o.error);
  }
};
using CallFn = std::function<void(int thread, Tally& t)>;

// One Execute into `t`; `want_device` non-empty: the device it must run on.
void ExecuteInto(client::Client& c, const v1::ExecuteRequest& req, const std::string& want_device,
                 Tally& t) {
  const auto t0 = Clock::now();
  auto resp = c.Execute(req);
  const double us = Us(Clock::now() - t0);
  if (!resp.ok()) {
    t.error = StatusText(resp.status());
    return;
  }
  ++t.ok;
  t.latency_us.push_back(us);
  t.compute_us.push_back(resp->timing().compute_us());
  if (resp->nodes_size() > 0) t.kernel_us.push_back(resp->nodes(0).kernel_us());
  ++t.devices[resp->device()];
  if (!want_device.empty() && resp->device() != want_device) ++t.misplaced;
}

constexpr double kWarmSeconds = 0.1;

// `threads` threads call back to back: a warm-up, then `seconds`. Calls that end after the
// warm-up count, into into[thread]; returns the seconds from the warm-up's end to the last end.
double Drive(int threads, double seconds, const CallFn& call, std::vector<Tally>& into) {
  const auto to_dur = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  std::atomic<bool> go{false};
  Clock::time_point from, until;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (;;) {
        Tally one;
        call(t, one);
        if (!one.error.empty() || Clock::now() >= from) {
          into[t].Merge(std::move(one));
          break;
        }
      }
      while (into[t].error.empty() && Clock::now() < until) call(t, into[t]);
    });
  }
  from = Clock::now() + to_dur(kWarmSeconds);
  until = from + to_dur(seconds);
  go.store(true, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  return std::chrono::duration<double>(Clock::now() - from).count();
}

// ---- Servers. ----

// Where each server runs: "" for the whole node; else the `cuda:0` of one GPU, through a script
// that sets CUDA_VISIBLE_DEVICES for it alone (a setenv here would race gRPC's threads).
class Launcher {
 public:
  explicit Launcher(std::string bin) : bin_(std::move(bin)) {}
  ~Launcher() {
    for (const std::string& f : files_) unlink(f.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  // A script that runs the server on the GPU the parent's CUDA_VISIBLE_DEVICES lists i-th.
  std::string OneGpu(int i) {
    if (dir_.empty()) {
      char tmpl[] = "/tmp/opserve-node-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) Die("mkdtemp for the one-GPU servers' scripts failed");
      dir_ = tmpl;
    }
    std::string visible = std::to_string(i);
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && *v != '\0') {
      std::vector<std::string> list = absl::StrSplit(v, ',');
      if (i < static_cast<int>(list.size())) visible = list[i];
    }
    const std::string path = absl::StrCat(dir_, "/gpu", i, ".sh");
    std::string quoted = "'";
    for (char ch : bin_) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    quoted += "'";
    std::ofstream f(path);
    f << "#!/bin/sh\nexport NCCL_NVLS_ENABLE=0\nexport CUDA_VISIBLE_DEVICES='" << visible
      << "'\nexec " << quoted << " \"$@\"\n";
    f.close();
    if (!f || chmod(path.c_str(), 0700) != 0) Die(absl::StrCat("cannot write ", path));
    files_.push_back(path);
    return path;
  }
  const std::string& bin() const { return bin_; }

 private:
  std::string bin_;
  std::string dir_;
  std::vector<std::string> files_;
};

// What --helpfull of the server lists: the budget flag's name and the test hook.
struct ServerFlags {
  std::string budget = "--memory_budget";
  bool fail_device = false;
};
ServerFlags ProbeServerFlags(const std::string& bin) {
  ServerFlags f;
  std::string text;
  if (FILE* p = popen(absl::StrCat("'", bin, "' --helpfull 2>&1").c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
    pclose(p);
  }
  // The per-device flag of the multi-device contract, or the older name of the same budget.
  if (!absl::StrContains(text, "--memory_budget ") &&
      !absl::StrContains(text, "--memory_budget (") &&
      absl::StrContains(text, "--memory_budget_bytes")) {
    f.budget = "--memory_budget_bytes";
  }
  f.fail_device = absl::StrContains(text, "test_fail_device");
  return f;
}

// A server and one client per device group (each its own connection), tensors deleted on close.
struct NodeServer {
  Session session;
  std::vector<std::unique_ptr<client::Client>> groups;
  std::unique_ptr<v1::OpServe::Stub> stub;
  std::vector<std::string> devices;  // ListOps' device names
  std::vector<v1::DeviceInfo> infos;

  std::string Open(const std::string& bin, const std::vector<std::string>& args, int n_groups) {
    if (std::string err = session.Open(bin, args); !err.empty()) {
      absl::StripTrailingAsciiWhitespace(&err);  // the server's own last line
      return err;
    }
    for (int i = 0; i < 200; ++i) {
      auto h = session.client->HealthServing();
      if (h.ok() && *h) break;
      if (i == 199) return "the server never reported SERVING";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stub = v1::OpServe::NewStub(session.client->channel());
    auto ops = session.client->ListOps();
    if (!ops.ok()) return absl::StrCat("ListOps: ", StatusText(ops.status()));
    for (const v1::DeviceInfo& d : ops->devices()) {
      devices.push_back(d.name());
      infos.push_back(d);
    }
    if (devices.empty()) {
      return "ListOps lists no devices: this server predates serving several";
    }
    for (int g = 0; g < n_groups; ++g) {
      client::ClientOptions co;
      co.target = absl::StrCat("127.0.0.1:", session.server.port());
      co.channel_args[kOwnSubchannelPool] = 1;
      auto c = client::Client::Connect(co);
      if (!c.ok()) return StatusText(c.status());
      groups.push_back(*std::move(c));
    }
    return "";
  }
  client::Client& c() { return *session.client; }
};

// ---- The section's state. ----

struct Skip {
  std::string what, why;
};

class Node {
 public:
  Node(NodeOptions o, Report& rep) : o_(std::move(o)), rep_(rep), launch_(o_.opserve_bin) {}
  int Run();

 private:
  void Resolve();
  std::vector<std::string> Args(std::vector<std::string> role) const;
  void Anchors();
  std::string Scaling(NodeServer& multi);
  std::string Cross(NodeServer& multi);
  std::string ShardedRowMean(NodeServer& multi);
  std::string ShardedMatmul(NodeServer& multi);
  std::string Fault();
  std::string Big();
  // A performance target: SKIP (cpu) off the GPU, else OK or MISS.
  void Perf(const std::string& what, const std::string& measured, bool holds);
  void Correct(const std::string& what, const std::string& measured, bool holds) {
    AddTarget(rep_, what, measured, holds);
  }
  void Section(const char* name, const std::function<std::string()>& run);
  void AddRow(std::string op, std::string shape, std::string dtype, std::string algorithm,
              bool anchor, int reps, double us, uint64_t bytes, uint64_t flops,
              std::string vs = "", double ratio = 0);
  std::string AllDevicesFlag() const {
    return cpu_ ? absl::StrCat("--device=cpu:", o_.cpu_devices) : "--device=cuda";
  }
  int Threads() const { return GenThreads(o_.gen_threads); }

  NodeOptions o_;
  Report& rep_;
  Launcher launch_;
  ServerFlags flags_;
  bool cpu_ = false;
  int gpus_ = 0;
  int n_ = 0;  // devices the whole-node server serves
  std::vector<Skip> skips_;
  std::vector<std::string> errors_;
  // Anchors (GPU only).
  std::vector<double> stream_gbps_;    // per GPU
  double peer_gbps_[2] = {0, 0};       // 0 -> 1, 1 -> 0
  double share_tflops_ = 0, share_us_ = 0, mm_cublas_us_ = 0;
};

void Node::Resolve() {
  auto def = [&](auto& v, auto gpu, auto cpu) {
    if (v <= 0) v = cpu_ ? cpu : gpu;
  };
  def(o_.clients, 16, 2);
  def(o_.seconds, 4.0, 1.0);
  def(o_.rounds, 4, 2);
  def(o_.reps, 10, 3);
  def(o_.stored_rows, int64_t{8192}, int64_t{256});
  def(o_.stored_cols, int64_t{8192}, int64_t{256});
  def(o_.tiny_rows, int64_t{10}, int64_t{10});
  def(o_.tiny_cols, int64_t{2048}, int64_t{2048});
  def(o_.mm, int64_t{8192}, int64_t{128});
  def(o_.rm_rows, int64_t{65536}, int64_t{1000});
  def(o_.rm_cols, int64_t{65536}, int64_t{512});
  def(o_.smm_m, int64_t{32768}, int64_t{256});
  def(o_.smm_k, int64_t{8192}, int64_t{128});
  def(o_.smm_n, int64_t{8192}, int64_t{128});
  if (o_.big_budget < 0) o_.big_budget = cpu_ ? int64_t{8} << 20 : int64_t{32} << 30;
  def(o_.big_cols, int64_t{65536}, int64_t{1024});
  def(o_.fail_after, 500, 20);
  def(o_.fault_seconds, 2.0, 1.0);
}

std::vector<std::string> Node::Args(std::vector<std::string> role) const {
  // The role's flags last: a --server_arg=--device=... would otherwise undo what the section
  // measures.
  std::vector<std::string> args = o_.server_args;
  args.insert(args.end(), role.begin(), role.end());
  return args;
}

void Node::Perf(const std::string& what, const std::string& measured, bool holds) {
  if (cpu_) {
    skips_.push_back({what, absl::StrCat("(cpu) measured ", measured)});
  } else {
    AddTarget(rep_, what, measured, holds);
  }
}

void Node::AddRow(std::string op, std::string shape, std::string dtype, std::string algorithm,
                  bool anchor, int reps, double us, uint64_t bytes, uint64_t flops,
                  std::string vs, double ratio) {
  Row r;
  r.op = std::move(op);
  r.shape = std::move(shape);
  r.dtype = std::move(dtype);
  r.algorithm = std::move(algorithm);
  r.is_anchor = anchor;
  r.reps = reps;
  r.median_us = us;
  r.bytes = bytes;
  r.flops = flops;
  r.gbps = us > 0 ? bytes / us / 1e3 : 0;
  r.tflops = us > 0 ? flops / us / 1e6 : 0;
  r.anchor = std::move(vs);
  r.ratio = ratio;
  rep_.rows.push_back(std::move(r));
}

void Node::Section(const char* name, const std::function<std::string()>& run) {
  if (o_.skip.count(name)) {
    absl::PrintF("\n[%s] skipped (--node_skip)\n", name);
    return;
  }
  absl::PrintF("\n[%s]\n", name);
  std::fflush(stdout);
  const auto t0 = Clock::now();
  const std::string err = run();
  if (!err.empty()) {
    absl::PrintF("  not measured: %s\n", err.c_str());
    errors_.push_back(absl::StrCat(name, ": ", err));
    // A section that could not run holds none of its targets: say so among them.
    AddTarget(rep_, absl::StrCat("node ", name, ": the section ran"), err, false);
  }
  absl::PrintF("  (%.1f s)\n", std::chrono::duration<double>(Clock::now() - t0).count());
  std::fflush(stdout);
}

// ---- Anchors, in this process. ----

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

// ---- 1. Scaling. ----

struct SeriesFigures {
  std::string name;
  double wall_s = 0;
  std::vector<Tally> groups;  // per device group, over all windows
  std::vector<double> round_rps;
  double Rps() const {
    int64_t ok = 0;
    for (const Tally& t : groups) ok += t.ok;
    return wall_s > 0 ? ok / wall_s : 0;
  }
  double GroupRps(size_t g) const { return wall_s > 0 ? groups[g].ok / wall_s : 0; }
  std::string Error() const {
    for (const Tally& t : groups) {
      if (!t.error.empty()) return t.error;
    }
    return "";
  }
  Tally All() const {
    Tally a;
    for (Tally t : groups) a.Merge(std::move(t));
    return a;
  }
};

std::string Node::Scaling(NodeServer& multi) {
  const int n = n_, clients = o_.clients;
  // One one-device server per device: CUDA_VISIBLE_DEVICES=i --device=cuda:0 (on the CPU, a
  // --device=cpu process each).
  std::deque<NodeServer> singles;
  for (int i = 0; i < n; ++i) {
    const std::string bin = cpu_ ? launch_.bin() : launch_.OneGpu(i);
    NodeServer& s = singles.emplace_back();
    if (std::string err = s.Open(bin, Args({cpu_ ? "--device=cpu" : "--device=cuda:0"}), 0);
        !err.empty()) {
      return absl::StrCat("one-device server ", i, ": ", err);
    }
  }
  const Gen stored{v1::FLOAT32, o_.stored_rows, o_.stored_cols, 101};
  const Gen tiny{v1::FLOAT32, o_.tiny_rows, o_.tiny_cols, 202};
  // The stored input: one copy on each device of the whole-node server, one in each process.
  std::vector<v1::ExecuteRequest> multi_stored(n);
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat("node_x", i);
    PutOutcome p = PutGen(*multi.stub, name, stored, multi.devices[i], false, false, Threads());
    if (!p.status.ok()) return absl::StrCat("PutTensor ", name, ": ", StatusText(p.status));
    if (p.info.device() != multi.devices[i]) {
      return absl::StrCat("PutTensor ", name, " with device ", multi.devices[i], " landed on ",
                          p.info.device());
    }
    multi_stored[i] = RowMeanOfStored(name);
    PutOutcome q = PutGen(*singles[i].stub, "node_x", stored, "", false, false, Threads());
    if (!q.status.ok()) return absl::StrCat("PutTensor on server ", i, ": ", StatusText(q.status));
  }
  const v1::ExecuteRequest single_stored = RowMeanOfStored("node_x");
  const v1::ExecuteRequest tiny_req = TinyRowMean(tiny);
  const int threads = n * clients;
  struct Series {
    std::string name;
    CallFn call;
  };
  std::vector<Series> series = {
      {"stored, N processes",
       [&](int t, Tally& r) { ExecuteInto(singles[t / clients].c(), single_stored, "", r); }},
      {"stored, one process",
       [&](int t, Tally& r) {
         const int g = t / clients;
         ExecuteInto(*multi.groups[g], multi_stored[g], multi.devices[g], r);
       }},
      {"tiny, N processes",
       [&](int t, Tally& r) { ExecuteInto(singles[t / clients].c(), tiny_req, "", r); }},
      {"tiny, one process",
       [&](int t, Tally& r) { ExecuteInto(*multi.groups[t / clients], tiny_req, "", r); }},
  };
  // Warm every channel and lane before the windows.
  for (const Series& s : series) {
    for (int t = 0; t < threads; t += std::max(1, clients / 4)) {
      for (int k = 0; k < 8; ++k) {
        Tally w;
        s.call(t, w);
        if (!w.error.empty()) return absl::StrCat(s.name, ": ", w.error);
      }
    }
  }
  std::vector<SeriesFigures> figs(series.size());
  for (size_t i = 0; i < series.size(); ++i) {
    figs[i].name = series[i].name;
    figs[i].groups.resize(n);
  }
  const int rounds = std::max(1, o_.rounds);
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < series.size(); ++k) {
      const size_t i = (k + round) % series.size();  // each series leads in turn
      std::vector<Tally> per_thread(threads);
      const double wall = Drive(threads, o_.seconds / rounds, series[i].call, per_thread);
      int64_t ok = 0;
      for (int t = 0; t < threads; ++t) {
        ok += per_thread[t].ok;
        figs[i].groups[t / clients].Merge(std::move(per_thread[t]));
      }
      figs[i].wall_s += wall;
      figs[i].round_rps.push_back(ok / wall);
      if (std::string e = figs[i].Error(); !e.empty()) return absl::StrCat(figs[i].name, ": ", e);
    }
  }
  absl::PrintF("  %d devices x %d clients, %d windows of %.2f s per series, taking turns\n", n,
              clients, rounds, o_.seconds / rounds);
  absl::PrintF("  %-22s %10s %-28s %9s %9s %10s %10s  %s\n", "series", "req/s", "per device",
              "p50 us", "p99 us", "kernel us", "compute us", "ran on");
  for (const SeriesFigures& f : figs) {
    std::vector<std::string> each;
    for (size_t g = 0; g < f.groups.size(); ++g) each.push_back(absl::StrFormat("%.0f", f.GroupRps(g)));
    const Tally a = f.All();
    std::vector<std::string> on;
    for (const auto& [d, c] : a.devices) on.push_back(absl::StrCat(d.empty() ? "?" : d, " ", c));
    absl::PrintF("  %-22s %10.0f %-28s %9.1f %9.1f %10.1f %10.1f  %s%s\n", f.name.c_str(), f.Rps(),
                absl::StrJoin(each, " + ").c_str(), Percentile(a.latency_us, 0.5),
                Percentile(a.latency_us, 0.99), Percentile(a.kernel_us, 0.5),
                Percentile(a.compute_us, 0.5), absl::StrJoin(on, ", ").c_str(),
                a.misplaced ? absl::StrCat(" (", a.misplaced, " not on their input's device)").c_str()
                            : "");
    AddRow("node", absl::StrCat(f.name.rfind("tiny", 0) == 0 ? tiny.Shape() : stored.Shape(), " c=",
                                clients, "/device"),
           "FLOAT32", absl::StrFormat("row_mean %s: %.0f req/s (p50 latency)", f.name, f.Rps()), false,
           static_cast<int>(a.latency_us.size()), Percentile(a.latency_us, 0.5), 0, 0);
  }
  auto spread = [&](const SeriesFigures& multi_f, const SeriesFigures& single_f) {
    std::vector<double> r;
    for (size_t i = 0; i < multi_f.round_rps.size() && i < single_f.round_rps.size(); ++i) {
      r.push_back(multi_f.round_rps[i] / single_f.round_rps[i]);
    }
    std::sort(r.begin(), r.end());
    return r.empty() ? std::string() : absl::StrFormat("; windows %.3f-%.3f", r.front(), r.back());
  };
  // The kernel-bound rate the stored workload could reach: each device back to back.
  const Tally one = figs[0].All();
  const double kernel_rate = n * 1e6 / std::max(1e-3, Percentile(one.kernel_us, 0.5));
  absl::PrintF("  predicted (stored): the N processes' %.0f req/s (kernel-bound ceiling N x 1/kernel "
              "= %.0f); measured one process %.0f\n",
              figs[0].Rps(), kernel_rate, figs[1].Rps());
  const int64_t misplaced = figs[1].All().misplaced;
  Perf(absl::StrFormat("node scaling: stored %s row_mean, one process >= %.2fx N processes",
                       stored.Shape(), kStoredScaling),
       absl::StrFormat("%.0f vs %.0f req/s = %.3fx", figs[1].Rps(), figs[0].Rps(),
                       figs[1].Rps() / figs[0].Rps()) +
           spread(figs[1], figs[0]) +
           (misplaced ? absl::StrCat("; ", misplaced, " ran off their input's device") : ""),
       figs[1].Rps() >= kStoredScaling * figs[0].Rps() && misplaced == 0);
  Perf(absl::StrFormat("node scaling: tiny %s inline row_mean, one process >= %.2fx N processes",
                       tiny.Shape(), kTinyScaling),
       absl::StrFormat("%.0f vs %.0f req/s = %.3fx", figs[3].Rps(), figs[2].Rps(),
                       figs[3].Rps() / figs[2].Rps()) +
           spread(figs[3], figs[2]),
       figs[3].Rps() >= kTinyScaling * figs[2].Rps());
  for (int i = 0; i < n; ++i) (void)multi.c().DeleteTensor(absl::StrCat("node_x", i));
  return "";
}

// ---- 2. A matmul across GPUs. ----

// The server's time for a request: compute_us + peer_copy_us (RequestTiming).
struct Timed {
  std::vector<double> us, peer_us;
  uint64_t peer_bytes = 0;
  std::string device;
};

std::string TimeExecute(client::Client& c, const v1::ExecuteRequest& req, Timed& into) {
  auto resp = c.Execute(req);
  if (!resp.ok()) return StatusText(resp.status());
  into.us.push_back(resp->timing().compute_us() + resp->timing().peer_copy_us());
  into.peer_us.push_back(resp->timing().peer_copy_us());
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
  const double same_us = Percentile(t_same.us, 0.5), cross_us = Percentile(t_cross.us, 0.5);
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
  absl::PrintF("  same device: %.1f us (cuBLAS alone %.1f us); across: %.1f us on %s, of which "
              "peer copy %.1f us for %llu bytes (%.1f GB/s as the server reports it)\n",
              same_us, mm_cublas_us_, cross_us, t_cross.device.c_str(), peer_us,
              static_cast<unsigned long long>(t_cross.peer_bytes),
              peer_us > 0 ? t_cross.peer_bytes / peer_us / 1e3 : 0.0);
  if (bw > 0) {
    absl::PrintF("  predicted across: %.1f + %llu B at the peer copy's %.1f GB/s (this process, "
                "cudaMemcpyPeerAsync cuda:%d->%d) = %.1f us; target allows %.1f us (at 0.8x)\n",
                same_us, static_cast<unsigned long long>(b_bytes), bw, src, 1 - src,
                same_us + b_bytes / (bw * 1e3), allowed);
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
  const double sh_us = Percentile(t_sh.us, 0.5), one_us = Percentile(t_one.us, 0.5);
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
  absl::PrintF("  sharded on %s: %.1f us (compute + peer copy; peer %.1f us for %llu bytes) = %.1f "
              "TFLOP/s; one share via the server %.1f us = %.1f TFLOP/s; cuBLAS share %.1f us = "
              "%.1f TFLOP/s\n",
              t_sh.device.c_str(), sh_us, Percentile(t_sh.peer_us, 0.5),
              static_cast<unsigned long long>(t_sh.peer_bytes), tflops, one_us,
              share_flops / one_us / 1e6, share_us_, share_tflops_);
  if (!cpu_ && peer_gbps_[0] > 0) {
    absl::PrintF("  predicted: B's broadcast %.0f bytes at %.1f GB/s + the share's GEMM %.1f us = "
                "%.1f us (if not overlapped) -> %.1f TFLOP/s\n",
                b_bytes, peer_gbps_[0], share_us_, b_bytes / (peer_gbps_[0] * 1e3) + share_us_,
                flops / (b_bytes / (peer_gbps_[0] * 1e3) + share_us_) / 1e6);
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

// ---- 5. Fault isolation. ----

std::string Node::Fault() {
  if (!flags_.fail_device) {
    skips_.push_back({"node fault isolation",
                      absl::StrCat(launch_.bin(), " has no --test_fail_device (build it with "
                                                  "-DOPSERVE_TEST_HOOKS=ON)")});
    return "";
  }
  const std::string dev1 = cpu_ ? "cpu:1" : "cuda:1";
  const int k = o_.fail_after;
  NodeServer s;
  if (std::string err = s.Open(launch_.bin(),
                               Args({AllDevicesFlag(), absl::StrCat("--test_fail_device=", dev1, "@", k)}),
                               2);
      !err.empty()) {
    return err;
  }
  if (s.devices.size() < 2 || s.devices[1] != dev1) {
    return absl::StrCat("want two devices, the second ", dev1, "; the server has ",
                        absl::StrJoin(s.devices, ", "));
  }
  const Gen x{v1::FLOAT32, o_.stored_rows, o_.stored_cols, 601};
  std::vector<v1::ExecuteRequest> reqs;
  for (int g = 0; g < 2; ++g) {
    const std::string name = absl::StrCat("f", g);
    PutOutcome p = PutGen(*s.stub, name, x, s.devices[g], false, false, Threads());
    if (!p.status.ok()) return absl::StrCat("PutTensor ", name, ": ", StatusText(p.status));
    reqs.push_back(RowMeanOfStored(name));
  }
  // Each thread's calls in order: ok, or the failure's code and message.
  struct Outcome {
    absl::StatusCode code;
    std::string message;
  };
  const int clients = o_.clients;
  std::vector<std::vector<Outcome>> seen(2 * clients);
  std::atomic<bool> done{false};
  int64_t polls = 0, not_serving = 0;
  std::thread health([&] {  // on a connection of its own
    client::ClientOptions co;
    co.target = absl::StrCat("127.0.0.1:", s.session.server.port());
    auto c = client::Client::Connect(co);
    while (!done.load()) {
      auto h = c.ok() ? (*c)->HealthServing() : absl::StatusOr<bool>(c.status());
      ++polls;
      not_serving += !(h.ok() && *h);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(o_.fault_seconds));
  std::vector<std::thread> pool;
  for (int t = 0; t < 2 * clients; ++t) {
    pool.emplace_back([&, t] {
      const int g = t / clients;
      while (Clock::now() < until) {
        auto r = s.groups[g]->Execute(reqs[g]);
        seen[t].push_back({r.status().code(), std::string(r.status().message())});
      }
    });
  }
  for (std::thread& t : pool) t.join();
  // After the window: each device as a new client finds it.
  auto after0 = s.c().Execute(reqs[0]);
  auto after1 = s.c().Execute(reqs[1]);
  auto health_after = s.c().HealthServing();
  auto ops = s.c().ListOps();
  done = true;
  health.join();

  int64_t ok[2] = {0, 0}, internal = 0, unavailable = 0, unnamed = 0, other = 0, ok_after_fail = 0;
  std::string other_text, unnamed_text;
  for (int t = 0; t < 2 * clients; ++t) {
    const int g = t / clients;
    bool failed = false;
    for (const Outcome& o : seen[t]) {
      if (o.code == absl::StatusCode::kOk) {
        ++ok[g];
        ok_after_fail += failed && g == 1;
        continue;
      }
      failed = true;
      if (g == 0) {
        ++other;
        if (other_text.empty()) other_text = absl::StrCat(s.devices[0], ": ", o.message);
      } else if (o.code == absl::StatusCode::kInternal) {
        ++internal;
      } else if (o.code == absl::StatusCode::kUnavailable) {
        ++unavailable;
        if (!absl::StrContains(o.message, dev1)) {
          ++unnamed;
          if (unnamed_text.empty()) unnamed_text = o.message;
        }
      } else {
        ++other;
        if (other_text.empty()) {
          other_text = absl::StrCat(absl::StatusCodeToString(o.code), ": ", o.message);
        }
      }
    }
  }
  int64_t n0 = 0;
  for (int t = 0; t < clients; ++t) n0 += seen[t].size();
  bool listed_out = false;
  if (ops.ok()) {
    for (const v1::DeviceInfo& d : ops->devices()) listed_out |= d.name() == dev1 && !d.serving();
  }
  const bool after1_named = !after1.ok() &&
                            after1.status().code() == absl::StatusCode::kUnavailable &&
                            absl::StrContains(after1.status().message(), dev1);
  absl::PrintF("  %d clients each on %s and %s for %.1f s, the fault at %s's request %d:\n", clients,
              s.devices[0].c_str(), dev1.c_str(), o_.fault_seconds, dev1.c_str(), k);
  absl::PrintF("    %s: %lld of %lld succeeded%s\n", s.devices[0].c_str(),
              static_cast<long long>(ok[0]), static_cast<long long>(n0),
              other_text.empty() ? "" : absl::StrCat("; first failure ", other_text).c_str());
  absl::PrintF("    %s: %lld succeeded, %lld INTERNAL, %lld UNAVAILABLE (%lld not naming it), %lld "
              "other, %lld successes after a thread's first failure\n",
              dev1.c_str(), static_cast<long long>(ok[1]), static_cast<long long>(internal),
              static_cast<long long>(unavailable), static_cast<long long>(unnamed),
              static_cast<long long>(other), static_cast<long long>(ok_after_fail));
  absl::PrintF("    after: %s %s; %s %s; ListOps lists %s %s; health polls %lld, not SERVING %lld\n",
              s.devices[0].c_str(), after0.ok() ? "OK" : StatusText(after0.status()).c_str(),
              dev1.c_str(), after1.ok() ? "OK" : StatusText(after1.status()).c_str(), dev1.c_str(),
              listed_out ? "not serving" : "serving (or absent)", static_cast<long long>(polls),
              static_cast<long long>(not_serving));
  const std::string where = cpu_ ? " (cpu)" : "";
  Correct(absl::StrCat("node fault", where, ": ", s.devices[0], "'s requests all succeed while ",
                       dev1, " fails"),
          absl::StrFormat("%d of %d, then %s", ok[0], n0,
                          after0.ok() ? "OK" : StatusText(after0.status())),
          ok[0] == n0 && n0 > 0 && after0.ok());
  // The K - 1 before the fault succeed; so may requests already queued there when it hit (at
  // most one a client: each waits for its answer), as a device without sticky errors (the CPU)
  // finishes them; none after a client's first failure.
  const bool fails_right = internal >= 1 && other == 0 && unnamed == 0 && ok_after_fail == 0 &&
                           ok[1] >= k - 1 && ok[1] <= k - 1 + (clients - 1) && after1_named &&
                           listed_out;
  Correct(absl::StrCat("node fault", where, ": ", dev1,
                       " fails from its K-th request (INTERNAL, then UNAVAILABLE naming it)"),
          absl::StrFormat("%d ok (K-1 = %d), %d INTERNAL, %d UNAVAILABLE; after: %s", ok[1], k - 1,
                          internal, unavailable,
                          after1.ok() ? "OK" : StatusText(after1.status())) +
              (unnamed_text.empty() ? "" : absl::StrCat("; unnamed: ", unnamed_text)) +
              (other_text.empty() ? "" : absl::StrCat("; other: ", other_text)),
          fails_right);
  Correct(absl::StrCat("node fault", where, ": gRPC health SERVING throughout and after"),
          absl::StrFormat("%d of %d polls not SERVING; after: %s", not_serving, polls,
                          health_after.ok() ? (*health_after ? "SERVING" : "NOT_SERVING")
                                            : StatusText(health_after.status())),
          not_serving == 0 && polls > 0 && health_after.ok() && *health_after);
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

int Node::Run() {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  cpu_ = o_.cpu || probe != cudaSuccess || count == 0;
  if (!cpu_) gpus_ = count;
  cudaGetLastError();
  Resolve();
  flags_ = ProbeServerFlags(launch_.bin());
  if (cpu_) {
    rep_.device = absl::StrCat(o_.cpu ? "--node_cpu" : absl::StrCat("no usable GPU (", cudaGetErrorName(probe), ")"),
                               ": ", o_.cpu_devices, " CPU devices, the plumbing at tiny sizes");
  }
  absl::PrintF("opserve-bench --ops=node on %s, %s\n  %s\n  server %s (budget flag %s, "
              "--test_fail_device %s)\n",
              cpu_ ? rep_.device.c_str() : absl::StrCat(gpus_, " GPUs").c_str(), rep_.date.c_str(),
              rep_.command.c_str(), launch_.bin().c_str(), flags_.budget.c_str(),
              flags_.fail_device ? "present" : "absent");
  if (!cpu_) {
    const auto t0 = Clock::now();
    Anchors();
    absl::PrintF("  (anchors %.1f s)\n", std::chrono::duration<double>(Clock::now() - t0).count());
  }
  {
    const bool need_multi = !o_.skip.count("scaling") || !o_.skip.count("cross") ||
                            !o_.skip.count("sharded") || !o_.skip.count("smm");
    NodeServer multi;
    std::string err;
    if (need_multi) {
      const int groups = cpu_ ? o_.cpu_devices : gpus_;
      err = multi.Open(launch_.bin(), Args({AllDevicesFlag()}), groups);
      if (err.empty()) {
        n_ = static_cast<int>(multi.devices.size());
        std::vector<std::string> d;
        for (const v1::DeviceInfo& i : multi.infos) {
          d.push_back(absl::StrFormat("%s (budget %.1f GiB%s)", i.name(),
                                      i.memory_budget() / double(kGiB),
                                      i.serving() ? "" : ", not serving"));
        }
        absl::PrintF("\nwhole-node server %s: %s\n", AllDevicesFlag().c_str(),
                    absl::StrJoin(d, ", ").c_str());
        if (n_ != groups) err = absl::StrCat("it serves ", n_, " devices, want ", groups);
      }
      if (!err.empty()) {
        errors_.push_back(absl::StrCat("whole-node server: ", err));
        absl::PrintF("\nwhole-node server: %s\n", err.c_str());
      }
    }
    if (need_multi && err.empty()) {
      // A section that kills the server would fail every later one for that reason alone.
      std::string gone;
      auto on_multi = [&](const char* name, std::string (Node::*section)(NodeServer&)) {
        Section(name, [&]() -> std::string {
          if (!gone.empty()) return gone;
          std::string e = (this->*section)(multi);
          if (!e.empty() && !multi.c().HealthServing().ok()) {
            gone = absl::StrCat("the whole-node server exited during [", name, "]");
            absl::StrAppend(&e, "; ", gone);
          }
          return e;
        });
      };
      on_multi("scaling", &Node::Scaling);
      on_multi("cross", &Node::Cross);
      on_multi("sharded", &Node::ShardedRowMean);
      on_multi("smm", &Node::ShardedMatmul);
    }
  }  // the whole-node server stops here: the next servers want the memory
  Section("fault", [&] { return Fault(); });
  Section("big", [&] { return Big(); });

  PrintReport(rep_);
  if (!skips_.empty()) {
    absl::PrintF("\nskipped targets:\n");
    for (const Skip& s : skips_) absl::PrintF("  SKIP %-62s %s\n", s.what.c_str(), s.why.c_str());
  }
  if (!errors_.empty()) {
    absl::PrintF("\nnot measured:\n");
    for (const std::string& e : errors_) absl::PrintF("  %s\n", e.c_str());
  }
  std::fflush(stdout);
  if (!o_.out_dir.empty() && !WriteReport(rep_, o_.out_dir)) return 1;
  return errors_.empty() ? 0 : 1;
}

bool ParseDims(const std::string& v, std::vector<int64_t*> out) {
  std::vector<std::string> parts = absl::StrSplit(v, 'x');
  if (parts.size() != out.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!absl::SimpleAtoi(parts[i], out[i]) || *out[i] <= 0) return false;
  }
  return true;
}

bool ParseBytes(const std::string& v, int64_t* out) {
  if (v.empty()) return false;
  int64_t unit = 1;
  std::string num = v;
  switch (v.back()) {
    case 'K': unit = int64_t{1} << 10; break;
    case 'M': unit = int64_t{1} << 20; break;
    case 'G': unit = int64_t{1} << 30; break;
    default: break;
  }
  if (unit != 1) num.pop_back();
  double x = 0;
  if (!absl::SimpleAtod(num, &x) || x < 0) return false;
  *out = static_cast<int64_t>(x * unit);
  return true;
}

}  // namespace

std::string ParseNodeFlag(const std::string& arg, NodeOptions* o) {
  const size_t eq = arg.find('=');
  const std::string key = arg.substr(0, eq), v = eq == std::string::npos ? "" : arg.substr(eq + 1);
  auto bad = [&] { return absl::StrCat("cannot read ", arg, " (--help lists the node flags)"); };
  auto pos_int = [&](int* dst) { return absl::SimpleAtoi(v, dst) && *dst > 0; };
  auto pos_double = [&](double* dst) { return absl::SimpleAtod(v, dst) && *dst > 0; };
  if (key == "--node_cpu" && eq == std::string::npos) {
    o->cpu = true;
  } else if (key == "--node_cpu_devices") {
    if (!pos_int(&o->cpu_devices) || o->cpu_devices < 2) return bad();
  } else if (key == "--node_skip") {
    for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      static const std::set<std::string> kSections = {"scaling", "cross", "sharded",
                                                      "smm",     "fault", "big"};
      if (!kSections.count(std::string(s))) return bad();
      o->skip.emplace(s);
    }
  } else if (key == "--node_clients") {
    if (!pos_int(&o->clients)) return bad();
  } else if (key == "--node_seconds") {
    if (!pos_double(&o->seconds)) return bad();
  } else if (key == "--node_rounds") {
    if (!pos_int(&o->rounds)) return bad();
  } else if (key == "--node_reps") {
    if (!pos_int(&o->reps)) return bad();
  } else if (key == "--node_stored") {
    if (!ParseDims(v, {&o->stored_rows, &o->stored_cols})) return bad();
  } else if (key == "--node_tiny") {
    if (!ParseDims(v, {&o->tiny_rows, &o->tiny_cols})) return bad();
  } else if (key == "--node_mm") {
    if (!ParseDims(v, {&o->mm})) return bad();
  } else if (key == "--node_rowmean") {
    if (!ParseDims(v, {&o->rm_rows, &o->rm_cols})) return bad();
  } else if (key == "--node_smm") {
    if (!ParseDims(v, {&o->smm_m, &o->smm_k, &o->smm_n})) return bad();
  } else if (key == "--node_big_budget") {
    if (!ParseBytes(v, &o->big_budget)) return bad();
  } else if (key == "--node_big_cols") {
    if (!ParseDims(v, {&o->big_cols})) return bad();
  } else if (key == "--node_fail_after") {
    if (!pos_int(&o->fail_after)) return bad();
  } else if (key == "--node_fault_seconds") {
    if (!pos_double(&o->fault_seconds)) return bad();
  } else if (key == "--node_gen_threads") {
    if (!pos_int(&o->gen_threads)) return bad();
  } else {
    return absl::StrCat("unknown argument ", arg, " (--help lists them)");
  }
  return "";
}

int RunNodeBench(const NodeOptions& options, Report& rep) {
  // Every server this section starts inherits it (the one-GPU servers' scripts set it again):
  // NVLink multicast stays off on machines whose GPUs others share.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  Node node(options, rep);
  return node.Run();
}

}  // namespace opserve::bench
