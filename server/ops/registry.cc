// The op table, put together from the op files, and the lookups over it: the choice of
// algorithm for a node ("auto" included) is made here and nowhere else.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/ops/op.h"

namespace opserve {

namespace ops {
// One per op file. Adding an op adds its file and one line to kOpFiles below.
OpEntry SumOp();
OpEntry RowSumOp();
OpEntry RowMeanOp();
OpEntry TransposeOp();
OpEntry MatmulOp();
OpEntry MaxOp();
OpEntry MinOp();
OpEntry RowMaxOp();
OpEntry RowMinOp();
// The fusion rules: server/ops/fusion.cc.
std::vector<FusionRule> FusionEntries();
}  // namespace ops

namespace {

constexpr OpEntry (*kOpFiles[])() = {ops::SumOp, ops::RowSumOp, ops::RowMeanOp,
                                     ops::TransposeOp, ops::MatmulOp,
                                     ops::MaxOp,
                                     ops::MinOp,
                                     ops::RowMaxOp,
                                     ops::RowMinOp,
};

// Op files outside server/ops/ (a test's toy op), which register themselves (RegisterOpFile)
// instead of a line in kOpFiles, in the order they registered. Registration runs
// during static initialisation, before main's threads, so no lock guards it.
std::vector<OpEntry (*)()>& RegisteredOpFiles() {
  static auto* const kFiles = new std::vector<OpEntry (*)()>;
  return *kFiles;
}
bool table_built = false;

[[noreturn]] void OpTableError(const std::string& what) {
  std::fprintf(stderr, "opserve op table: %s\n", what.c_str());
  std::abort();
}

// Built on first use, not at namespace scope: the test suites list their cases from the table
// during static initialisation, possibly before another file's globals are constructed.
struct Table {
  std::vector<OpSpec> ops;
  std::vector<AlgoSpec> algorithms;
  std::vector<AutoRule> auto_rules;
  std::vector<FusionRule> fusion_rules;

  // One op file's entry, built-in or registered: the one way into the table.
  void Add(OpEntry (*entry)()) {
    OpEntry e = entry();
    for (const OpSpec& op : ops) {
      if (op.name == e.spec.name) OpTableError(absl::StrCat("op '", e.spec.name, "' added twice"));
    }
    ops.push_back(e.spec);
    for (AlgoSpec& a : e.algorithms) algorithms.push_back(std::move(a));
    for (const AutoRule& r : e.auto_rules) auto_rules.push_back(r);
  }
};

const Table& TheTable() {
  static const Table* const kTable = [] {
    auto* t = new Table;
    for (auto* entry : kOpFiles) t->Add(entry);
    for (auto* entry : RegisteredOpFiles()) t->Add(entry);
    t->fusion_rules = ops::FusionEntries();
    table_built = true;
    return t;
  }();
  return *kTable;
}


std::string AlgorithmNames(const std::vector<const AlgoSpec*>& algos) {
  std::vector<absl::string_view> names;
  for (const AlgoSpec* a : algos) names.push_back(a->name);
  names.push_back("auto");
  return absl::StrJoin(names, ", ");
}

bool Accepts(const AlgoSpec& a, DType d) {
  for (DType x : a.dtypes) {
    if (x == d) return true;
  }
  return false;
}

}  // namespace

std::string ComputeCapabilityName(int cc) { return absl::StrCat(cc / 10, ".", cc % 10); }

absl::StatusOr<int> ParseComputeCapability(absl::string_view text) {
  const size_t dot = text.find('.');
  const absl::string_view major = text.substr(0, dot);
  const absl::string_view minor = dot == absl::string_view::npos ? "" : text.substr(dot + 1);
  auto digits = [](absl::string_view s, size_t most) {
    return !s.empty() && s.size() <= most &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(major, 2) || !digits(minor, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a compute capability MAJOR.MINOR such as 8.0 or 12.0"));
  }
  return (std::stoi(std::string(major)) * 10) + (minor[0] - '0');
}

bool RegisterOpFile(OpEntry (*entry)()) {
  if (table_built) {
    OpTableError(absl::StrCat("op '", entry().spec.name,
                              "' registered after the table was first read"));
  }
  RegisteredOpFiles().push_back(entry);
  return true;
}

std::span<const OpSpec> Ops() { return TheTable().ops; }
std::span<const AlgoSpec> Algorithms() { return TheTable().algorithms; }
std::span<const AutoRule> AutoRules() { return TheTable().auto_rules; }
std::span<const FusionRule> FusionRules() { return TheTable().fusion_rules; }

const AlgoSpec* CpuReference(absl::string_view op) {
  for (const AlgoSpec& a : Algorithms()) {
    if (a.op == op && a.backend == "cpu") return &a;
  }
  return nullptr;
}

const OpSpec* FindOp(absl::string_view name) {
  for (const OpSpec& op : Ops()) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

std::vector<DType> DTypesFor(absl::string_view op, const DeviceProperties& device) {
  std::vector<DType> out;
  for (DType d : kAllDTypes) {
    for (const AlgoSpec* a : AlgorithmsFor(op, device)) {
      if (Accepts(*a, d)) {
        out.push_back(d);
        break;
      }
    }
  }
  return out;
}

namespace {

bool FitsSharedMemory(const AlgoSpec& a, const DeviceProperties& device) {
  return a.min_shared_memory_per_block == 0 || device.max_shared_memory_per_block() == 0 ||
         a.min_shared_memory_per_block <= device.max_shared_memory_per_block();
}

bool RunsOn(const AlgoSpec& a, const DeviceProperties& device) {
  const int cc = device.compute_capability();
  return a.min_compute_capability <= cc &&
         (a.max_compute_capability == 0 || cc <= a.max_compute_capability) &&
         FitsSharedMemory(a, device);
}

// Why `device` does not run `a`, a row of its own backend: the capabilities on both sides.
std::string CapabilityMismatch(const AlgoSpec& a, const DeviceProperties& device) {
  const int cc = device.compute_capability();
  if (!FitsSharedMemory(a, device)) {
    return absl::StrCat(a.op, " algorithm ", Quote(a.name), " needs ",
                        a.min_shared_memory_per_block, " bytes of shared memory per block; this "
                        "device (", device.capability_source(), ") allows ",
                        device.max_shared_memory_per_block());
  }
  const std::string min = ComputeCapabilityName(a.min_compute_capability);
  const std::string max = ComputeCapabilityName(a.max_compute_capability);
  std::string needs;
  if (cc < a.min_compute_capability) {
    needs = absl::StrCat("needs compute capability ", min);
  } else if (a.max_compute_capability == a.min_compute_capability) {
    needs = absl::StrCat("runs on compute capability ", max, " only");
  } else {
    needs = absl::StrCat("runs on compute capability ", min, " to ", max);
  }
  return absl::StrCat(a.op, " algorithm ", Quote(a.name), " ", needs, "; this device (",
                      device.capability_source(), ") is ", ComputeCapabilityName(cc));
}

}  // namespace

std::vector<const AlgoSpec*> AlgorithmsFor(absl::string_view op, const DeviceProperties& device) {
  std::vector<const AlgoSpec*> out;
  for (const AlgoSpec& a : Algorithms()) {
    if (a.op == op && a.backend == device.name() && RunsOn(a, device)) {
      out.push_back(&a);
    }
  }
  return out;
}

const AlgoSpec* FindAlgorithm(absl::string_view op, absl::string_view name, const DeviceProperties& device) {
  for (const AlgoSpec* a : AlgorithmsFor(op, device)) {
    if (a->name == name) return a;
  }
  return nullptr;
}

namespace {

// The row that runs `a` on these inputs: `a` itself, or the fallback it names for shapes it does
// not support (followed while rows keep falling back; the table has no cycles, but a bound keeps
// a wrong row from looping).
absl::StatusOr<const AlgoSpec*> WithFallback(const AlgoSpec* a, std::span<const TensorMeta> inputs,
                                             const DeviceProperties& device) {
  for (int hops = 0; a->supports != nullptr && !a->supports(inputs); ++hops) {
    const AlgoSpec* next = FindAlgorithm(a->op, a->fallback, device);
    if (next == nullptr || hops > 4 || !Accepts(*next, inputs[0].dtype)) {
      return absl::InternalError(absl::StrCat("algorithm ", a->name, " falls back to ",
                                              Quote(a->fallback), ", which cannot run ",
                                              inputs[0].DebugString()));
    }
    a = next;
  }
  return a;
}

}  // namespace

// Chooses the algorithm a node runs: the one named, or for "auto" the op's chooser or default.
absl::StatusOr<const AlgoSpec*> ResolveAlgorithm(const OpSpec& op, std::span<const TensorMeta> inputs,
                                                 absl::string_view requested,
                                                 const DeviceProperties& device) {
  const auto algos = AlgorithmsFor(op.name, device);
  const DType dtype = inputs[0].dtype;
  if (requested.empty() || requested == "auto") {
    for (const AutoRule& rule : AutoRules()) {
      if (rule.op != op.name || rule.backend != device.name()) continue;
      const AlgoSpec* a = FindAlgorithm(op.name, rule.choose(inputs, device), device);
      if (a != nullptr && Accepts(*a, dtype)) return WithFallback(a, inputs, device);
    }
    for (const AlgoSpec* a : algos) {
      if (a->is_default && Accepts(*a, dtype)) return WithFallback(a, inputs, device);
    }
    for (const AlgoSpec* a : algos) {
      if (Accepts(*a, dtype)) return WithFallback(a, inputs, device);
    }
    return absl::UnimplementedError(absl::StrCat("no algorithm of the ", device.name(),
                                                 " backend runs ", DTypeName(dtype), " ",
                                                 op.name));
  }
  const AlgoSpec* a = FindAlgorithm(op.name, requested, device);
  if (a == nullptr) {
    for (const AlgoSpec& row : Algorithms()) {
      if (row.op == op.name && row.name == requested && row.backend == device.name()) {
        return absl::UnimplementedError(absl::StrCat(CapabilityMismatch(row, device),
                                                     "; it runs: ", AlgorithmNames(algos)));
      }
    }
    // A name no backend's row of the op has is the request's mistake; a row of another backend
    // (cuda's "cub" asked of the CPU) is this server's limit.
    bool anywhere = false;
    for (const AlgoSpec& row : Algorithms()) anywhere |= row.op == op.name && row.name == requested;
    if (!anywhere) {
      return absl::InvalidArgumentError(absl::StrCat("op ", Quote(op.name), " has no algorithm ",
                                                     Quote(requested), "; this backend runs: ",
                                                     AlgorithmNames(algos)));
    }
    return absl::UnimplementedError(absl::StrCat("algorithm ", Quote(requested), " is not available on the ",
                                                 device.name(), " backend; it has: ",
                                                 AlgorithmNames(algos)));
  }
  if (!Accepts(*a, dtype)) {
    std::vector<const AlgoSpec*> ok;
    for (const AlgoSpec* x : algos) {
      if (Accepts(*x, dtype)) ok.push_back(x);
    }
    return absl::UnimplementedError(absl::StrCat("algorithm ", Quote(requested), " does not run ",
                                                 DTypeName(dtype), "; algorithms that do: ",
                                                 AlgorithmNames(ok)));
  }
  return WithFallback(a, inputs, device);
}

const AlgoSpec* FusedKernel(const FusionRule& rule, std::span<const TensorMeta> inputs,
                            const TensorMeta& output, const DeviceProperties& device) {
  if (rule.kernels.empty()) {
    // The outer op itself on the inner node's inputs, where that gives the same output.
    const OpSpec* outer = FindOp(rule.outer);
    if (outer == nullptr || static_cast<int>(inputs.size()) != outer->arity) return nullptr;
    auto meta = outer->infer(inputs);
    if (!meta.ok() || meta->dtype != output.dtype || meta->shape != output.shape) return nullptr;
    auto a = ResolveAlgorithm(*outer, inputs, "auto", device);
    return a.ok() ? *a : nullptr;
  }
  for (const AlgoSpec& a : rule.kernels) {
    if (a.backend == device.name() && RunsOn(a, device) && Accepts(a, inputs[0].dtype)) return &a;
  }
  return nullptr;
}

}  // namespace opserve
