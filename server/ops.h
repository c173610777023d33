// The op table: every op the server knows, and every algorithm of every backend.
// Adding an algorithm is one kernel file plus one row in kAlgorithms (op_table.cc); the tests
// iterate over that table.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "server/backend.h"
#include "server/tensor.h"

namespace opserve {

using AttrValue = std::variant<int64_t, double, std::string, bool>;
using AttrMap = std::map<std::string, AttrValue, std::less<>>;

// What a kernel gets: pointers into backend memory, the metadata, and the execution context.
struct KernelArgs {
  std::span<const void* const> inputs;
  std::span<const TensorMeta> input_meta;
  void* output;
  const TensorMeta& output_meta;
  const AttrMap& attrs;
  ExecEnv& env;
};
using KernelFn = absl::Status (*)(const KernelArgs&);

// The minimum an op must move and compute: each input read once, the output written once.
struct Cost {
  uint64_t bytes = 0;
  uint64_t flops = 0;
};

// What an op's output holds when an input has no elements: no kernel runs then, and the output
// (which may still have elements, e.g. row_sum of [R, 0] or matmul of [M, 0] x [0, N]) is filled.
enum class EmptyFill {
  kZeros,  // every byte 0: the sum of nothing
  kNaN,    // every byte 0xFF, a float32 NaN: the mean of nothing (numpy's answer)
};

struct OpSpec {
  absl::string_view name;
  absl::string_view description;
  int arity;
  std::span<const DType> dtypes;             // input dtypes the op accepts on some backend
  std::span<const absl::string_view> attrs;   // attribute names the op accepts
  // Checks the inputs' dtypes and shapes and returns the output's. Errors are INVALID_ARGUMENT
  // and name the input and what was expected against what was received.
  absl::StatusOr<TensorMeta> (*infer)(std::span<const TensorMeta> inputs);
  Cost (*cost)(std::span<const TensorMeta> inputs, const TensorMeta& output);
  EmptyFill empty_fill;
};

struct AlgoSpec {
  absl::string_view op;
  absl::string_view name;
  absl::string_view backend;          // "cpu" or "cuda"
  std::vector<DType> dtypes;         // input dtypes this algorithm runs
  KernelFn run;
  bool deterministic;
  bool is_default;                   // what "auto" runs when the op has no chooser
  int min_compute_capability;        // 0: any; 90: Hopper-only (bulk tensor copies, wgmma)
  absl::string_view description;
  // Shapes the kernel cannot take (e.g. rows TMA cannot describe): when `supports` says no, the
  // node runs `fallback`, another row of the same op, and reports it as the algorithm that ran.
  // nullptr: every shape of the accepted dtypes.
  bool (*supports)(std::span<const TensorMeta> inputs) = nullptr;
  absl::string_view fallback = {};
  // 0: no upper bound. Architecture-specific code (sm_90a's wgmma) runs on its own
  // architecture only, so such a row is not offered on a newer device at all.
  int max_compute_capability = 0;
};

// Picks the algorithm name for "auto" from the inputs (e.g. row_mean by shape).
using AutoChooser = absl::string_view (*)(std::span<const TensorMeta> inputs,
                                         const Backend& backend);
struct AutoRule {
  absl::string_view op;
  absl::string_view backend;
  AutoChooser choose;
};

std::span<const OpSpec> Ops();
std::span<const AlgoSpec> Algorithms();
std::span<const AutoRule> AutoRules();

const OpSpec* FindOp(absl::string_view name);
// The input dtypes `backend` runs `op` for: the union of its algorithms' dtypes, in DType order.
std::vector<DType> DTypesFor(absl::string_view op, const Backend& backend);
// The algorithms of `op` that `backend` can run on a device of `compute_capability`.
std::vector<const AlgoSpec*> AlgorithmsFor(absl::string_view op, const Backend& backend);
const AlgoSpec* FindAlgorithm(absl::string_view op, absl::string_view name, const Backend& backend);

// The algorithm a node of `op` runs on `backend`: the one `requested`, or for "" / "auto" the
// op's AutoRule, else its default; then, where that row does not support the inputs' shape, its
// fallback row. UNIMPLEMENTED (listing what the backend has) when the backend lacks it or it
// does not run the inputs' dtype.
absl::StatusOr<const AlgoSpec*> ResolveAlgorithm(const OpSpec& op, std::span<const TensorMeta> inputs,
                                                 absl::string_view requested, const Backend& backend);

}  // namespace opserve
