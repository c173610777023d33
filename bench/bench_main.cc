// opserve-bench: every op x algorithm x dtype of the op table (its "cuda" rows, plus `auto` as
// ResolveAlgorithm resolves it), timed against the ceilings a user would otherwise reach for,
// measured in the same run: the device-to-device copy, a float4 read-only stream, CUB's reduce and
// segmented reduce, and cuBLAS SGEMM (pedantic FP32), TF32 and BF16. Optionally the service path
// over loopback gRPC (--ops=...,service). A benchmark, not a test.
//
//   opserve-bench [--ops=OP,...,fusion,service,load,replay,kserve,stream,cublas_handles] [--quick]
//                 [--out=DIR]
//                 [--reps=N] [--algos=a,b,auto] [--shapes=LABEL,...] [--opserve=PATH]
//
// OP is any op of the table; without --ops, every op, fusion and service run.
//
// This file: the command line, the bench's case sets (which case file runs for each --ops= name,
// in what order), the targets that read every op's rows, and the report. The method is in
// harness.h; each op's shapes, anchors, checks and targets in cases/OP.cc, and an op of the table
// without a case file runs from its test model (cases/table.cc).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/mutex_checks.h"
#include "server/engine/cuda_backend.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/node_bench.h"
#if OPSERVE_BENCH_SERVICE
#include "bench/replay_bench.h"
#include "bench/service_bench.h"
#include "bench/stream_bench.h"
#endif

namespace opserve::bench {
namespace {

// The bench's case sets: each --ops= name that times kernels with a case file of its own and the
// file's entry point, in the order a run measures them (after the ceilings, and after the
// transpose sweep when one is asked for); then every other op of the table that --ops names, from
// its test model (TableCases). "service" is not among them: it drives the server
// (service_bench.cc).
struct CaseSet {
  const char* op;
  void (*run)(Bench& bench);
};
constexpr CaseSet kCaseSets[] = {
    {"sum", SumCases},
    {"row_mean", RowMeanCases},
    {"row_sum", RowSumCases},
    {"transpose", TransposeCases},
    {"matmul", MatmulCases},
    {"fusion", FusionCases},
    {"col_sweep", ColReduceSweep},
    {"cublas_handles", CublasHandles},
};

// Each case file's targets, in the order they print.
constexpr void (*kTargetSets[])(Report& rep) = {SumTargets, RowReduceTargets, TransposeTargets,
                                                MatmulTargets, FusionTargets};

// ---- Targets, read off the rows: each op's own, then those of every op and the
// service path's. ----
void AddTargets(Report& rep) {
  for (const auto targets : kTargetSets) targets(rep);
  for (const Row& r : rep.rows) {
    if (r.algorithm.rfind("auto->", 0) != 0 || r.best.empty()) continue;
    AddTarget(rep,
              absl::StrCat(r.op, " ", r.shape, " ", r.dtype, ": auto within 5% of the fastest"),
              absl::StrFormat("%s %.3f of %s", r.algorithm, r.vs_best, r.best), r.vs_best >= 0.95);
  }
  const ServiceFigures& s = rep.service;
  if (s.ran) {
    AddTarget(rep, "service: Execute p50 - kernel <= 1.5x health p50",
              absl::StrFormat("%.1f us vs 1.5 x %.1f = %.1f us", s.overhead_p50_us,
                              s.health_p50_us, 1.5 * s.health_p50_us),
              s.overhead_p50_us <= 1.5 * s.health_p50_us);
    AddTarget(rep, "service: PutTensor 1 GiB >= 1.5 GB/s", absl::StrFormat("%.2f GB/s", s.put_gbps),
              s.put_gbps >= 1.5);
    AddTarget(rep, "service: GetTensor 1 GiB >= 1.5 GB/s", absl::StrFormat("%.2f GB/s", s.get_gbps),
              s.get_gbps >= 1.5);
  }
}

// The node section's own flags (--node_*), read by node_bench.cc when --ops=node runs.
std::vector<std::string>& NodeFlags() {
  static std::vector<std::string> flags;
  return flags;
}

std::set<std::string> SplitSet(const std::string& s) {
  std::set<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) out.emplace(p);
  return out;
}

std::vector<int> SplitInts(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    const int v = std::atoi(std::string(p).c_str());
    if (v <= 0) Die(absl::StrCat("want positive integers, got '", p, "' in '", s, "'"));
    out.push_back(v);
  }
  return out;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  bool saw_ops = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--ops=")) {
      o.ops = SplitSet(v);
      saw_ops = true;
    } else if (a == "--service") {
      o.ops = {"service"};
      saw_ops = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (const char* v = val("--out=")) {
      o.out_dir = v;
    } else if (const char* v = val("--reps=")) {
      o.reps = std::max(kMinReps, std::atoi(v));
    } else if (const char* v = val("--algos=")) {
      o.algos = SplitSet(v);
    } else if (const char* v = val("--shapes=")) {
      o.shapes = SplitSet(v);
    } else if (a == "--transpose-sweep") {
      o.transpose_sweep = true;
    } else if (a == "--sweep_one_tile") {
      o.sweep_one_tile = true;
      o.transpose_sweep = true;
    } else if (const char* v = val("--load_lanes=")) {
      o.load_lanes = SplitInts(v);
    } else if (const char* v = val("--load_conc=")) {
      o.load_conc = SplitInts(v);
    } else if (const char* v = val("--load_workloads=")) {
      o.load_workloads = SplitSet(v);
    } else if (const char* v = val("--load_seconds=")) {
      o.load_seconds = std::atof(v);
    } else if (const char* v = val("--load_rounds=")) {
      o.load_rounds = std::atoi(v);
    } else if (const char* v = val("--load_channels=")) {
      o.load_channels = std::atoi(v);
      if (o.load_channels < 1) Die(absl::StrCat("--load_channels wants 1 or more, got ", v));
    } else if (const char* v = val("--load_variant=")) {
      const std::string spec = v;
      const size_t colon = spec.find(':');
      if (colon == 0 || colon == std::string::npos) {
        Die(absl::StrCat("--load_variant wants LABEL:ARG[,ARG...], got ", spec));
      }
      const std::string label = spec.substr(0, colon);
      for (const auto& variant : o.load_variants) {
        if (variant.first == label) Die(absl::StrCat("--load_variant ", label, " given twice"));
      }
      std::vector<std::string> args;
      for (absl::string_view arg : absl::StrSplit(spec.substr(colon + 1), ',', absl::SkipEmpty())) {
        args.emplace_back(arg);
      }
      o.load_variants.push_back({label, std::move(args)});
    } else if (const char* v = val("--server_arg=")) {
      o.server_args.emplace_back(v);
    } else if (const char* v = val("--chunk_bytes=")) {
      o.chunk_bytes = std::atoll(v);
    } else if (const char* v = val("--http_mib=")) {
      o.http_mib = std::max<long long>(1, std::atoll(v));
    } else if (const char* v = val("--opserve=")) {
      o.opserve_bin = v;
    } else if (a.rfind("--node_", 0) == 0) {
      NodeFlags().push_back(a);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "opserve-bench [--ops=OP,...,fusion,service,load,replay,kserve,http,stream,cublas_handles\n"
          "               (OP: any op of the table; default: every op, fusion, service)]\n"
          "              [--service]\n"
          "              [--load_lanes=1,2,4] [--load_conc=1,16,64]\n"
          "              [--load_workloads=4096x4096,8192x8192,10x2048 (default) or 4096x4]\n"
          "              [--load_seconds=S] [--load_rounds=N] [--load_variant=LABEL:ARG,ARG ...\n"
          "               (ARG --client_arg=KEY=INT: the client's channel argument;\n"
          "                --server_bin=PATH: that opserve binary for this variant)]\n"
          "              [--load_channels=N (targets only at 1)]\n"
          "              [--quick]\n"
          "              [--out=DIR] [--reps=N>=20] [--algos=a,b,auto] [--shapes=LABEL,...]\n"
          "              [--opserve=PATH] [--transpose-sweep] [--chunk_bytes=N]\n"
          "              [--server_arg=ARG ...] [--http_mib=MiB (--ops=http's shm size)]\n");
      std::printf("%s", kNodeUsage);
      std::exit(0);
    } else {
      Die(absl::StrCat("unknown argument ", a, " (--help lists them)"));
    }
  }
  if (!saw_ops) {
    for (const OpSpec& op : Ops()) o.ops.emplace(op.name);
    o.ops.insert({"fusion", "service"});
  }
  return o;
}

bool HasCaseSet(absl::string_view name) {
  for (const CaseSet& cases : kCaseSets) {
    if (cases.op == name) return true;
  }
  return false;
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  return p.substr(0, p.rfind('/'));
}

}  // namespace
}  // namespace opserve::bench

int main(int argc, char** argv) {
  using namespace opserve;
  using namespace opserve::bench;
  Options opt = ParseArgs(argc, argv);
  // As the server does: the load section's client threads would otherwise share one lock.
  SkipMutexDeadlockChecks();
  Report rep;
  {
    std::vector<std::string> args(argv, argv + argc);
    rep.command = absl::StrJoin(args, " ");
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
    rep.date = date;
  }
  // --ops=node: one server over every device of the node, a run of its own (node_bench.h).
  if (opt.ops.count("node")) {
#if OPSERVE_BENCH_SERVICE
    NodeOptions no;
    for (const std::string& f : NodeFlags()) {
      if (std::string err = ParseNodeFlag(f, &no); !err.empty()) Die(err);
    }
    no.opserve_bin = opt.opserve_bin;
    if (no.opserve_bin.empty()) {
      const std::string beside = SelfDir() + "/opserve";
      no.opserve_bin = access(beside.c_str(), X_OK) == 0 ? beside : OPSERVE_BIN_DEFAULT;
    }
    no.server_args = opt.server_args;
    no.out_dir = opt.out_dir;
    return RunNodeBench(no, rep);
#else
    Die("--ops=node needs the client library, which this build lacks");
#endif
  }
  // `--ops=service --server_arg=--device=cpu` runs without a GPU: the service path of the CPU
  // backend, for looking at the gRPC side of the overhead on any machine.
  // --ops=load: the load section alone (the load grid, or the part of it --load_* names).
  const bool load_only = opt.ops.size() == 1 && opt.ops.count("load");
  // --ops=http: the HTTP/REST section alone; on the CPU backend without a GPU.
  const bool http_only = opt.ops.size() == 1 && opt.ops.count("http");
  // --ops=stream: ExecuteStream against the unary floor alone (stream_bench.h), CPU or GPU.
  const bool stream_only = opt.ops.size() == 1 && opt.ops.count("stream");
  const bool service_only =
      (opt.ops.size() == 1 && opt.ops.count("service") && !opt.transpose_sweep) || load_only ||
      http_only || stream_only;
  // --ops=kserve: the Open Inference Protocol section alone (it needs the GPU).
  const bool kserve_only = opt.ops.size() == 1 && opt.ops.count("kserve");
  // --ops=replay: the CUDA-graph replay section alone (it needs the GPU).
  const bool replay_only = opt.ops.size() == 1 && opt.ops.count("replay");
  bool have_gpu = true;
  if (absl::Status s = ProbeCuda(0); !s.ok()) {
    if (!service_only) Die(absl::StrCat("no usable GPU: ", s.message()));
    rep.device = absl::StrCat("no usable GPU (", s.message(), "), service path only");
    have_gpu = false;
  } else {
    cudaDeviceProp prop{};
    Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    rep.device = absl::StrFormat("%s (sm_%d%d, %d SMs, %d MB L2, %zu MiB)", prop.name, prop.major,
                                 prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
                                 prop.totalGlobalMem >> 20);
  }
  std::printf("opserve-bench on %s, %s\n  %s\n", rep.device.c_str(), rep.date.c_str(),
              rep.command.c_str());

  bool kernels = opt.transpose_sweep;
  for (const CaseSet& cases : kCaseSets) kernels = kernels || opt.ops.count(cases.op) > 0;
  for (const OpSpec& op : Ops()) kernels = kernels || opt.ops.count(std::string(op.name)) > 0;
  if (kernels) {
    // The server's own backend and execution context: the table rows run exactly as they do
    // inside opserve (scratch from the stream-ordered pool, the worker's stream and cuBLAS handle).
    auto backend = MakeCudaBackend(0, 0);
    if (!backend.ok()) Die(std::string(backend.status().message()));
    auto env = (*backend)->NewExecEnv();
    if (!env.ok()) Die(std::string(env.status().message()));
    Bench bench(opt, backend->get(), env->get());
    std::printf("ceilings\n");
    bench.Ceilings();
    if (opt.transpose_sweep) TransposeSweep(bench, opt.out_dir);
    for (const CaseSet& cases : kCaseSets) {
      if (opt.ops.count(cases.op)) cases.run(bench);
    }
    for (const OpSpec& op : Ops()) {
      if (opt.ops.count(std::string(op.name)) && !HasCaseSet(op.name)) TableCases(bench, op);
    }
    Report& r = bench.report();
    rep.rows = std::move(r.rows);
    rep.copy_gbps = r.copy_gbps;
    rep.stream_gbps = r.stream_gbps;
    rep.floor_us = r.floor_us;
  }
  if (opt.ops.count("service") || kserve_only || load_only || replay_only || http_only ||
      opt.ops.count("stream")) {
#if OPSERVE_BENCH_SERVICE
    ServiceOptions so;
    so.opserve_bin = opt.opserve_bin;
    so.chunk_bytes = opt.chunk_bytes;
    so.server_args = opt.server_args;
    // Without a GPU the server runs on the CPU backend; a --server_arg=--device=... still wins
    // (it comes later on the command line).
    if (!have_gpu) so.server_args.insert(so.server_args.begin(), "--device=cpu");
    if (so.opserve_bin.empty()) {
      const std::string beside = SelfDir() + "/opserve";
      so.opserve_bin = access(beside.c_str(), X_OK) == 0 ? beside : OPSERVE_BIN_DEFAULT;
    }
    if (opt.ops.count("stream")) {
      StreamBenchOptions sto;
      sto.opserve_bin = so.opserve_bin;
      sto.server_args = so.server_args;
      if (opt.load_seconds > 0) sto.seconds = opt.load_seconds;
      if (opt.load_rounds > 0) sto.rounds = opt.load_rounds;
      std::printf("pipelined requests: ExecuteStream row_mean 10x2048 vs unary Health/Check\n");
      std::fflush(stdout);
      rep.stream = RunStreamBench(sto);
      PrintStream(rep.stream);
    }
    if (!kserve_only && !load_only && !replay_only && !http_only && !stream_only) {
      std::printf("service path over loopback gRPC (%s, chunk %lld bytes; 0: the client default)\n",
                  so.opserve_bin.c_str(), static_cast<long long>(so.chunk_bytes));
      std::fflush(stdout);
      rep.service = RunServiceBench(so);
    }
    if (!kserve_only && !replay_only && !http_only && !stream_only) {
      ConcurrencyOptions co;
      co.opserve_bin = so.opserve_bin;
      co.server_args = so.server_args;
      if (!opt.load_lanes.empty()) co.lanes = opt.load_lanes;
      if (!opt.load_conc.empty()) co.concurrency = opt.load_conc;
      if (opt.load_seconds > 0) co.seconds = opt.load_seconds;
      co.workloads = opt.load_workloads;
      if (opt.load_rounds > 0) co.rounds = opt.load_rounds;
      co.channels = opt.load_channels;
      co.variants = opt.load_variants;
      if (!opt.out_dir.empty()) co.windows_csv = opt.out_dir + "/load_windows.csv";
      std::printf("service under concurrent load: lanes %s x concurrency %s\n",
                  absl::StrJoin(co.lanes, ", ").c_str(), absl::StrJoin(co.concurrency, ", ").c_str());
      std::fflush(stdout);
      rep.load = RunConcurrencyBench(co);
      PrintConcurrency(rep.load, opt.out_dir.empty() ? "" : opt.out_dir + "/load.csv");
    }
    if (have_gpu && !kserve_only && !load_only && !http_only && !stream_only) {
      ReplayOptions ro;
      ro.opserve_bin = so.opserve_bin;
      ro.server_args = so.server_args;
      rep.replay = RunReplayBench(ro);
      PrintReplay(rep.replay);
    }
    if (have_gpu && !load_only && !replay_only && !http_only && !stream_only) {
      KServeOptions ko;
      ko.opserve_bin = so.opserve_bin;
      ko.server_args = so.server_args;
      rep.kserve = RunKServeBench(ko);
      PrintKServe(rep.kserve);
    }
    if (http_only || (have_gpu && !load_only && !replay_only && !kserve_only && !stream_only)) {
      HttpOptions ho;
      ho.opserve_bin = so.opserve_bin;
      ho.server_args = so.server_args;
      ho.shm_mib = opt.http_mib;
      ho.gpu = have_gpu;
      rep.http = RunHttpBench(ho);
      PrintHttp(rep.http);
    }
#else
    rep.service.error = "built without the client library";
#endif
  }
  AddTargets(rep);
  AddConcurrencyTargets(rep.load, rep);
  AddReplayTargets(rep.replay, rep);
  AddKServeTargets(rep.kserve, rep);
  AddHttpTargets(rep.http, rep);
  AddStreamTargets(rep.stream, rep);
  PrintReport(rep);
  // A sweep run writes only its own transpose_sweep.csv.
  if (!opt.out_dir.empty() && !opt.transpose_sweep && !WriteReport(rep, opt.out_dir)) return 1;
  return 0;
}
