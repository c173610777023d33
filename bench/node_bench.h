// The node section of opserve-bench (--ops=node): one opserve process serving every GPU of a
// node, against N one-GPU processes and the node's own anchors, all measured in one run.
//
//   1. Scaling: stored row_mean (one copy of the input on each GPU) and tiny inline row_mean,
//      C clients per GPU: the one process's req/s against the sum of N processes started with
//      CUDA_VISIBLE_DEVICES=i --device=cuda:0, the two taking turns in short windows.
//   2. A matmul whose inputs live on two GPUs against the same matmul on one, plus B's bytes at
//      0.8 x the peer-copy bandwidth this process measures (cudaMemcpyPeerAsync).
//   3. A sharded row_mean against N x one GPU's read stream; and on 2 GPUs a sharded tensor of
//      1.5 x one device's --memory_budget: stored, reduced, read back, while an unsharded put of
//      it answers RESOURCE_EXHAUSTED naming the budget.
//   4. A sharded BF16 matmul (B broadcast) against N x cuBLAS on one GPU's share of the rows.
//   5. Fault isolation: --test_fail_device on one GPU under load on both.
//
// Without a usable GPU (or with --node_cpu) the same sections run against --device=cpu:D with
// tiny sizes: the plumbing, not the speed. Performance targets then print as SKIP (cpu); the
// correctness checks (over-budget tensor, fault isolation) still hold or miss.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace opserve::bench {

struct NodeOptions {
  std::string opserve_bin;
  std::vector<std::string> server_args;  // --server_arg=: appended to every server's command line
  std::string out_dir;                   // bench.csv / bench.json when set
  bool cpu = false;                      // --node_cpu: the CPU devices even where a GPU is
  int cpu_devices = 2;                   // --node_cpu_devices: D of --device=cpu:D
  std::set<std::string> skip;  // --node_skip=scaling,cross,sharded,smm,fault,big
  // Sizes and counts; 0 (or -1 for big_budget): the mode's default, full size on GPUs, tiny on
  // the CPU (node_bench.cc, Resolve).
  int clients = 0;         // --node_clients: per device
  double seconds = 0;      // --node_seconds: per scaling series, over all its windows
  int rounds = 0;          // --node_rounds: windows per scaling series
  int reps = 0;            // --node_reps: timed Executes of the matmuls and the sharded row_mean
  int64_t stored_rows = 0, stored_cols = 0;  // --node_stored=RxC
  int64_t tiny_rows = 0, tiny_cols = 0;      // --node_tiny=RxC
  int64_t mm = 0;                            // --node_mm=S: the cross-GPU matmul, S^3
  int64_t rm_rows = 0, rm_cols = 0;          // --node_rowmean=RxC: the sharded row_mean
  int64_t smm_m = 0, smm_k = 0, smm_n = 0;   // --node_smm=MxKxN: the sharded matmul
  int64_t big_budget = -1;  // --node_big_budget=BYTES[K|M|G]: per device; 0 skips the section
  int64_t big_cols = 0;     // --node_big_cols
  int fail_after = 0;       // --node_fail_after=K: --test_fail_device=DEV@K
  double fault_seconds = 0; // --node_fault_seconds
  int gen_threads = 0;      // --node_gen_threads: threads drawing upload data (0: half the cores)
};

inline constexpr char kNodeUsage[] =
    "  --ops=node: one server over every device of the node (runs alone; CPU devices without a\n"
    "  GPU), with [--node_cpu] [--node_cpu_devices=2] [--node_skip=scaling,cross,sharded,smm,\n"
    "  fault,big] [--node_clients=16] [--node_seconds=4] [--node_rounds=4] [--node_reps=10]\n"
    "  [--node_stored=8192x8192] [--node_tiny=10x2048] [--node_mm=8192]\n"
    "  [--node_rowmean=65536x65536] [--node_smm=32768x8192x8192] [--node_big_budget=32G (0: off)]\n"
    "  [--node_big_cols=65536] [--node_fail_after=500] [--node_fault_seconds=2]\n"
    "  [--node_gen_threads=N]\n";

// Parses one --node_* argument into *o; an error message ("" when it parsed).
std::string ParseNodeFlag(const std::string& arg, NodeOptions* o);

struct Report;
// Measures, fills `rep` (device, ceilings, rows, targets), prints the report and writes it to
// out_dir; the process's exit status (1 when a section could not run).
int RunNodeBench(const NodeOptions& options, Report& rep);

}  // namespace opserve::bench
