// The op table: every op the server knows and every algorithm of every backend. Each op lives in
// one file of server/ops/ (sum.cc, row_reduce.cc, transpose.cc, matmul.cc) that holds all of it:
// spec, shape inference, cost, CPU reference, algorithm rows, `auto` chooser and test model.
// registry.cc lists those files' entries. Validation, ListOps, the engine, the bench and every
// test suite read the table through the functions at the bottom of this header.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/ops/tensor.h"

namespace opserve {

using AttrValue = std::variant<int64_t, double, std::string, bool>;
using AttrMap = std::map<std::string, AttrValue, std::less<>>;

// An input still being copied in from another device while its node runs (a sharded matmul's
// B, broadcast in blocks of columns so that the GEMM starts on the first): seen as `rows` rows of
// `row_bytes`, the bytes [0, ends[i]) of every row are there once events[i] (a cudaEvent_t) has
// fired; ends ascend and the last is row_bytes.
struct InputArrival {
  uint64_t rows = 0, row_bytes = 0;
  std::vector<uint64_t> ends;
  std::vector<void*> events;
};

// What a kernel may ask of the device it runs on. The engine's ExecEnv implements it.
class KernelEnv {
 public:
  virtual ~KernelEnv() = default;
  virtual void* stream() { return nullptr; }       // cudaStream_t on CUDA
  virtual void* blas_handle() { return nullptr; }  // cublasHandle_t on CUDA
  // Device memory that lives until the request's device work is done (CUB's temp storage).
  virtual absl::StatusOr<void*> Scratch(uint64_t bytes) = 0;
  // Input `input` of the running node while it is still arriving, else nullptr. Only a row with
  // AlgoSpec::reads_arriving sees one: for the others the executor waits for all of it first.
  virtual const InputArrival* arriving(int input) const { return nullptr; }
  // Makes the kernels queued next wait until `a`'s chunk `chunk` (bytes [0, a.ends[chunk]) of
  // every row) is there.
  virtual absl::Status AwaitArrival(const InputArrival& a, size_t chunk) {
    return absl::OkStatus();
  }
};

// What a kernel gets: pointers into backend memory, the metadata, and the device it runs on.
struct KernelArgs {
  std::span<const void* const> inputs;
  std::span<const TensorMeta> input_meta;
  void* output;
  const TensorMeta& output_meta;
  const AttrMap& attrs;
  KernelEnv& env;
};
using KernelFn = absl::Status (*)(const KernelArgs&);

// Compute capabilities are written major * 10 + minor, as CUDA's sm_XY names are: 80 is 8.0.
// The oldest one the CUDA kernels are built for (OPSERVE_CUDA_ARCHS) and every CUDA row needs:
// A100's 8.0 (the kernels use cp.async, bf16 and TF32 mma.sync).
constexpr int kSm80 = 80;  // Ampere (A100), and every newer GPU
constexpr int kSm90 = 90;  // Hopper (H100, H200): bulk tensor copies (TMA), wgmma
constexpr int kMinCudaComputeCapability = kSm80;
// "8.0" for 80, "12.0" for 120.
std::string ComputeCapabilityName(int cc);
// "8.0" -> 80, "12.0" -> 120 (major.minor, minor one digit); INVALID_ARGUMENT otherwise.
absl::StatusOr<int> ParseComputeCapability(absl::string_view text);

// What algorithms a device can run: its backend's name and, on CUDA, its architecture. The
// engine's Backend implements it.
class DeviceProperties {
 public:
  virtual ~DeviceProperties() = default;
  virtual std::string name() const = 0;                 // "cpu" or "cuda": a row's backend
  // 90 for sm_90; 0 on the CPU. What the rows are chosen by: on a capped device
  // (--max_compute_capability) the cap, not the GPU's own.
  virtual int compute_capability() const { return 0; }
  virtual int sm_count() const { return 0; }             // multiprocessors; 0 on the CPU
  // Shared memory one block may use when it opts in (cudaDevAttrMaxSharedMemoryPerBlockOptin):
  // 227 KiB on 9.0 and 10.0, 163 KiB on 8.0, 99 KiB on 8.6, 8.9 and 12.0. 0: unknown, or the CPU.
  virtual int max_shared_memory_per_block() const { return 0; }
  // The device as messages about its compute capability name it: the GPU, and the cap where
  // one lowers its capability (e.g. "NVIDIA H100 80GB HBM3, 9.0 capped by
  // --max_compute_capability").
  virtual std::string capability_source() const { return name(); }
};

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

// How the test suites measure the error of a FLOAT32 output against the CPU reference's
// (tests/support/result_check.h); an output of any other dtype must equal it bit for bit.
enum class ErrorScale {
  kExact,          // max, min: every output bit for bit, NaN included (the tolerance is 0)
  kReduction,      // each output reduces a contiguous run of inputs: |y - r| / sum |x| of the run
  kMean,           // as kReduction, over the mean of |x|
  kComponentwise,  // matmul: |Y - R| / (|A| |B|) per element, normwise on large outputs
  kNormwise,       // ||Y - R|| / ||R||
};

// The op's test model: the suites read it, so a new op brings its own cases and no test file
// keeps an op list.
struct TestModel {
  // Edge cases: each case is the shapes of the op's inputs (1, one past a tile, primes, large).
  std::vector<std::vector<std::vector<int64_t>>> edge_shapes;
  // More edge cases, run by the GPU suite only: too slow for the CPU reference suites (a GiB
  // tensor, rows of a million elements, matrices 2048 and more a side).
  std::vector<std::vector<std::vector<int64_t>>> large_shapes;
  // Small, typical shapes for service-level tests (soak, e2e): quick on the CPU backend.
  std::vector<std::vector<std::vector<int64_t>>> small_shapes;
  ErrorScale error_scale = ErrorScale::kNormwise;
  // The relative-error bound of `algorithm` on `dtype` inputs; integer outputs must be exact.
  double (*tolerance)(absl::string_view algorithm, DType dtype) = nullptr;
};

struct OpSpec {
  absl::string_view name;
  absl::string_view description;
  int arity = 1;
  std::span<const DType> dtypes;              // input dtypes the op accepts on some backend
  std::span<const absl::string_view> attrs;   // attribute names the op accepts
  // Checks the inputs' dtypes and shapes and returns the output's. Errors are INVALID_ARGUMENT
  // and name the input and what was expected against what was received.
  absl::StatusOr<TensorMeta> (*infer)(std::span<const TensorMeta> inputs) = nullptr;
  Cost (*cost)(std::span<const TensorMeta> inputs, const TensorMeta& output) = nullptr;
  EmptyFill empty_fill = EmptyFill::kZeros;
  TestModel test;
};

struct AlgoSpec {
  absl::string_view op;
  absl::string_view name;
  absl::string_view backend;   // "cpu" or "cuda"
  std::vector<DType> dtypes;   // input dtypes this algorithm runs
  KernelFn run = nullptr;
  bool deterministic = true;
  bool is_default = false;     // what "auto" runs when the op has no chooser
  // The compute capability the row needs. 0: none, which only CPU rows may say; every CUDA row
  // states kMinCudaComputeCapability (kSm80) or more (a table test checks), kSm90 for the
  // Hopper rows (bulk tensor copies, wgmma). ListOps, `auto` and named requests offer a row only
  // on devices that have it.
  int min_compute_capability = 0;
  // Bytes of shared memory a block of the kernel asks for, where that is more than every device
  // of its capabilities gives (the default 48 KiB): a device that allows a block less does not
  // offer the row. 0: no such need.
  int min_shared_memory_per_block = 0;
  // 0: no upper bound. Architecture-specific code (sm_90a's wgmma) runs on its own
  // architecture only, so such a row is not offered on a newer device at all.
  int max_compute_capability = 0;
  absl::string_view description;
  // Shapes the kernel cannot take (e.g. rows TMA cannot describe): when `supports` says no, the
  // node runs `fallback`, another row of the same op, and reports it as the algorithm that ran.
  // nullptr: every shape of the accepted dtypes.
  bool (*supports)(std::span<const TensorMeta> inputs) = nullptr;
  absl::string_view fallback = {};
  // Whether `run` consults KernelEnv::arriving and waits for each input chunk by chunk itself
  // (its kernels start while the rest of an input is still being copied in).
  bool reads_arriving = false;
};

// ---- Fusion: two nodes, outer(inner(...)), run as one kernel (server/ops/fusion.cc) ----
// The planner rewrites a pattern when the inner node's output is read by the outer node alone
// (not returned, stored or read elsewhere), both nodes ask for `auto`, and neither sets the
// attribute fuse=false. The outer node then reads the inner node's inputs and runs the rule's
// kernel; the inner node runs nothing. Both report the rule's name as their algorithm.
struct FusionTestModel {
  // The inner node's input shapes: each case is one graph, checked against the unfused graph.
  std::vector<std::vector<std::vector<int64_t>>> shapes;
  std::vector<std::vector<std::vector<int64_t>>> large_shapes;  // the GPU suite only
  // FLOAT32 outputs: the bound on ||fused - unfused|| / ||unfused|| on inputs drawn from
  // [0, 1) (no cancellation, so the norm measures the summation error alone). Integer outputs
  // must be equal.
  double tolerance = 0;
  // The CPU row gives the unfused CPU graph's bits.
  bool cpu_bitwise = false;
};

struct FusionRule {
  absl::string_view name;   // "fused:col_mean": what both nodes report as their algorithm
  absl::string_view outer;  // the op of the node that stays and runs the kernel
  absl::string_view inner;  // the op whose output only the outer node reads
  absl::string_view description;
  // The fused kernel, a row per backend (.op is the outer op): it reads the inner node's inputs
  // and writes the outer node's output. Empty: the outer op's own `auto` row on the inner node's
  // inputs (sum(row_sum(X)) is sum(X)).
  std::vector<AlgoSpec> kernels;
  FusionTestModel test;
};

std::span<const FusionRule> FusionRules();
// The row that runs `rule` on `device` for the inner node's `inputs`, whose fused output must be
// `output`; nullptr when there is none (another backend, dtype or capability), and the nodes
// then run unfused.
const AlgoSpec* FusedKernel(const FusionRule& rule, std::span<const TensorMeta> inputs,
                            const TensorMeta& output, const DeviceProperties& device);

// Picks the algorithm name for "auto" from the inputs (e.g. row_mean by shape).
using AutoChooser = absl::string_view (*)(std::span<const TensorMeta> inputs,
                                         const DeviceProperties& device);
struct AutoRule {
  absl::string_view op;
  absl::string_view backend;
  AutoChooser choose;
};

// Everything one op file contributes to the table.
struct OpEntry {
  OpSpec spec;
  std::vector<AlgoSpec> algorithms;
  std::vector<AutoRule> auto_rules;
};

std::span<const OpSpec> Ops();
std::span<const AlgoSpec> Algorithms();
std::span<const AutoRule> AutoRules();

// An op file outside server/ops/ (a test's toy op) joins the table through the same entry
// function a built-in op file has, registered before the table is first read:
//   const bool kRegistered = RegisterOpFile(ToyNegateOp);  // at namespace scope, in its file
// The table lists the built-in files (registry.cc's kOpFiles) first, then these in the order
// they were registered. Registering after the first read, or an op name the table already
// has, is a programming error: the process says which and aborts.
bool RegisterOpFile(OpEntry (*entry)());

const OpSpec* FindOp(absl::string_view name);
// The CPU backend's row of `op`: the reference every other algorithm is tested against.
const AlgoSpec* CpuReference(absl::string_view op);
// The input dtypes `device` runs `op` for: the union of its algorithms' dtypes, in DType order.
std::vector<DType> DTypesFor(absl::string_view op, const DeviceProperties& device);
// The algorithms of `op` that `device` can run.
std::vector<const AlgoSpec*> AlgorithmsFor(absl::string_view op, const DeviceProperties& device);
const AlgoSpec* FindAlgorithm(absl::string_view op, absl::string_view name,
                              const DeviceProperties& device);

// The algorithm a node of `op` runs on `device`: the one `requested`, or for "" / "auto" the
// op's AutoRule, else its default; then, where that row does not support the inputs' shape, its
// fallback row. UNIMPLEMENTED (listing what the device has) when the device lacks it or it
// does not run the inputs' dtype; for a row of the device's backend that needs another compute
// capability, the message names the capability the row needs and the device's.
absl::StatusOr<const AlgoSpec*> ResolveAlgorithm(const OpSpec& op,
                                                 std::span<const TensorMeta> inputs,
                                                 absl::string_view requested,
                                                 const DeviceProperties& device);

}  // namespace opserve
