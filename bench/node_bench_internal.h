// What the files of the node section (node_bench.h) share:
//   node_bench.cc    the flags, the sections in order, the OK / MISS / SKIP summary;
//   node_data.cc     the upload data, and the checks of what comes back;
//   node_servers.cc  starting servers, streaming tensors to and from them, the requests;
//   node_anchors.cc  topology and the anchors measured in this process;
//   node_scaling.cc  1. one process against N;
//   node_graphs.cc   2.-4. the cross-GPU matmul, the sharded row_mean and matmul, and the tensor
//                    larger than one device's budget;
//   node_fault.cc    5. fault isolation.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/node_bench.h"
#include "bench/service_process.h"

namespace opserve::bench::node_bench {

inline constexpr uint64_t kGiB = 1ull << 30;
// Targets (the brief of this section; node_bench.h).
inline constexpr double kStoredScaling = 0.95, kTinyScaling = 0.90, kPeerShare = 0.8,
                        kStreamShare = 0.9, kGemmShare = 0.85;

// ---- Deterministic values: fresh random-looking floats in [-1, 1), never zero. Upload data is
// drawn from a counter hash of (seed, element index), so a chunk can be made, and a read-back
// checked, anywhere without holding the tensor in host memory (node_data.cc). ----

inline uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline float ValueAt(uint64_t seed, uint64_t i) {
  const float v = static_cast<float>(Mix(seed * 0xD1B54A32D192ED03ull + i) >> 40) *
                      (2.0f / 16777216.0f) -
                  1.0f;
  return v == 0.0f ? 0.5f : v;
}

inline uint16_t Bf16Bits(float f) {  // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16Float(uint16_t b) {
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
std::string Draw(const Gen& g, uint64_t e0, uint64_t e1, std::vector<RowPart>* sums);

// Threads drawing upload data: `asked`, or half the cores (1 to 16) when it is 0.
int GenThreads(int asked);

// Spot-checks of a read-back against the generator: in each chunk, its first and last 16
// elements and 16 more spread over it.
struct SpotCheck {
  uint64_t checked = 0, wrong = 0;
  int64_t first_wrong = -1;
  void Chunk(const Gen& g, uint64_t offset, const std::string& bytes);
};

// Row means in `data` against sums drawn with the data; a line on the first wrong row, or "".
std::string CheckRowMeans(const std::string& data, const std::vector<double>& sum,
                          const std::vector<double>& abs, int64_t cols);

// ---- Transfers through the generated stub, and the requests (node_servers.cc). ----

struct PutOutcome {
  grpc::Status status;
  v1::TensorInfo info;
  double seconds = 0;
  std::vector<double> row_sum, row_abs;  // with row sums asked for (FLOAT32)
};

// Streams `g` to the server as `name`, with PutTensorHeader's device and shard: chunks drawn by
// `threads` threads ahead of the one writer, in order, at most two per thread in memory at once
// (a tensor larger than host memory streams as well as a small one).
PutOutcome PutGen(v1::OpServe::Stub& stub, const std::string& name, const Gen& g,
                  const std::string& device, bool shard, bool row_sums, int threads);

// GetTensor `name` in chunks handed to `on_chunk(byte offset, bytes)` as they arrive.
grpc::Status ReadTensor(v1::OpServe::Stub& stub, const std::string& name,
                        const std::function<void(uint64_t, const std::string&)>& on_chunk,
                        v1::TensorInfo* info, uint64_t* bytes);

v1::ExecuteRequest TinyRowMean(const Gen& g);
v1::ExecuteRequest MatmulStored(const std::string& a, const std::string& b,
                                const std::string& store_as);

std::string StatusText(const absl::Status& s);
std::string StatusText(const grpc::Status& s);

// ---- Servers (node_servers.cc). ----

// Where each server runs: "" for the whole node; else the `cuda:0` of one GPU, through a script
// that sets CUDA_VISIBLE_DEVICES for it alone (a setenv here would race gRPC's threads).
class Launcher {
 public:
  explicit Launcher(std::string bin) : bin_(std::move(bin)) {}
  ~Launcher();
  // A script that runs the server on the GPU the parent's CUDA_VISIBLE_DEVICES lists i-th.
  std::string OneGpu(int i);
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
ServerFlags ProbeServerFlags(const std::string& bin);

// A server and one client per device group (each its own connection), tensors deleted on close.
struct NodeServer {
  Session session;
  std::vector<std::unique_ptr<client::Client>> groups;
  std::unique_ptr<v1::OpServe::Stub> stub;
  std::vector<std::string> devices;  // ListOps' device names
  std::vector<v1::DeviceInfo> infos;

  // "" once the server reports SERVING and lists its devices, else why not.
  std::string Open(const std::string& bin, const std::vector<std::string>& args, int n_groups);
  client::Client& c() { return *session.client; }
};

// ---- The section's state: one member function per section, each in its section's file. ----

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

}  // namespace opserve::bench::node_bench
