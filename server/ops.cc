// Lookups over the op table, and the choice of algorithm for a node ("auto" included).
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/ops.h"

namespace opserve {
namespace {


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

const OpSpec* FindOp(absl::string_view name) {
  for (const OpSpec& op : Ops()) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

std::vector<DType> DTypesFor(absl::string_view op, const Backend& backend) {
  std::vector<DType> out;
  for (DType d : kAllDTypes) {
    for (const AlgoSpec* a : AlgorithmsFor(op, backend)) {
      if (Accepts(*a, d)) {
        out.push_back(d);
        break;
      }
    }
  }
  return out;
}

std::vector<const AlgoSpec*> AlgorithmsFor(absl::string_view op, const Backend& backend) {
  std::vector<const AlgoSpec*> out;
  for (const AlgoSpec& a : Algorithms()) {
    const int cc = backend.compute_capability();
    if (a.op == op && a.backend == backend.name() && a.min_compute_capability <= cc &&
        (a.max_compute_capability == 0 || cc <= a.max_compute_capability)) {
      out.push_back(&a);
    }
  }
  return out;
}

const AlgoSpec* FindAlgorithm(absl::string_view op, absl::string_view name, const Backend& backend) {
  for (const AlgoSpec* a : AlgorithmsFor(op, backend)) {
    if (a->name == name) return a;
  }
  return nullptr;
}

namespace {

// The row that runs `a` on these inputs: `a` itself, or the fallback it names for shapes it does
// not support (followed while rows keep falling back; the table has no cycles, but a bound keeps
// a wrong row from looping).
absl::StatusOr<const AlgoSpec*> WithFallback(const AlgoSpec* a, std::span<const TensorMeta> inputs,
                                             const Backend& backend) {
  for (int hops = 0; a->supports != nullptr && !a->supports(inputs); ++hops) {
    const AlgoSpec* next = FindAlgorithm(a->op, a->fallback, backend);
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
                                                 const Backend& backend) {
  const auto algos = AlgorithmsFor(op.name, backend);
  const DType dtype = inputs[0].dtype;
  if (requested.empty() || requested == "auto") {
    for (const AutoRule& rule : AutoRules()) {
      if (rule.op != op.name || rule.backend != backend.name()) continue;
      const AlgoSpec* a = FindAlgorithm(op.name, rule.choose(inputs, backend), backend);
      if (a != nullptr && Accepts(*a, dtype)) return WithFallback(a, inputs, backend);
    }
    for (const AlgoSpec* a : algos) {
      if (a->is_default && Accepts(*a, dtype)) return WithFallback(a, inputs, backend);
    }
    for (const AlgoSpec* a : algos) {
      if (Accepts(*a, dtype)) return WithFallback(a, inputs, backend);
    }
    return absl::UnimplementedError(absl::StrCat("no algorithm of the ", backend.name(),
                                                 " backend runs ", DTypeName(dtype), " ",
                                                 op.name));
  }
  const AlgoSpec* a = FindAlgorithm(op.name, requested, backend);
  if (a == nullptr) {
    return absl::UnimplementedError(absl::StrCat("algorithm ", Quote(requested), " is not available on the ",
                                                 backend.name(), " backend; it has: ",
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
  return WithFallback(a, inputs, backend);
}

}  // namespace opserve
