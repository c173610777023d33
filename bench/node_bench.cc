// The node section (node_bench.h): one opserve serving every device of a node. The anchors are
// measured in this process first (node_anchors.cc), its contexts are then reset so the servers
// see the GPUs' whole memory, and the sections drive real servers over loopback gRPC
// (node_scaling.cc, node_graphs.cc, node_fault.cc). This file holds the flags, the sizes each
// mode defaults to, the sections in order and the summary; node_bench_internal.h maps the rest.
#include "bench/node_bench.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench {
namespace node_bench {

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

}  // namespace node_bench

namespace {

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
  node_bench::Node node(options, rep);
  return node.Run();
}

}  // namespace opserve::bench
