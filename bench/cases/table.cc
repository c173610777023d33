// opserve-bench's cases for an op of the table that has no case file of its own: every "cuda"
// row of the op and `auto`, on the op's large test shapes (its largest edge case where it has
// none; --quick: the first), on every dtype a row takes, by GB/s against the run's read stream,
// each output checked against the CPU reference on the host with the op's own measure and
// tolerance (tests/support/result_check.h). So a new op is timed with no edit here; a case file
// (the shapes users run, CUB or cuBLAS anchors, targets) takes over once the op deserves one.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/harness.h"
#include "server/ops/host_kernel_env.h"
#include "tests/support/result_check.h"

namespace opserve::bench {
namespace {

// "268436457", "4096x4096", "4096x4096 x 4096x4096" for two inputs.
std::string Label(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<std::string> parts;
  for (const auto& s : shapes) parts.push_back(s.empty() ? "scalar" : absl::StrJoin(s, "x"));
  return absl::StrJoin(parts, " x ");
}

std::vector<char> ToHost(const void* d, uint64_t bytes) {
  std::vector<char> h(bytes);
  Check(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost), "copy to host");
  return h;
}

// The CPU reference's output on input set 0, and the check of a row's output against it.
class ReferenceCheck {
 public:
  ReferenceCheck(const Case& c, Sets& sets) : c_(c), sets_(sets) {}

  void operator()(Row& r) {
    if (reference_.empty()) Compute();
    const std::vector<char> got = ToHost(sets_.out(0), c_.output.Bytes());
    const OpResult result{*c_.op, c_.inputs, ptrs_, c_.output, got.data(), reference_.data()};
    const absl::StatusOr<double> err = RelativeError(result);
    r.error = err.ok() ? *err : -1;
    const absl::Status ok = CheckResult(result, r.algorithm.substr(r.algorithm.rfind('>') + 1));
    r.error_ok = ok.ok();
    if (!ok.ok()) std::printf("    %s: %s\n", r.algorithm.c_str(), std::string(ok.message()).c_str());
  }

 private:
  void Compute() {
    for (size_t i = 0; i < c_.inputs.size(); ++i) {
      inputs_.push_back(ToHost(sets_.in(i, 0), c_.inputs[i].Bytes()));
      ptrs_.push_back(inputs_.back().data());
    }
    reference_.resize(c_.output.Bytes());
    HostKernelEnv env;
    AttrMap attrs;
    const KernelArgs args{ptrs_, c_.inputs, reference_.data(), c_.output, attrs, env};
    if (absl::Status s = CpuReference(c_.op->name)->run(args); !s.ok()) {
      Die(absl::StrCat(c_.op->name, ": the CPU reference failed: ", s.message()));
    }
  }

  const Case& c_;
  Sets& sets_;
  std::vector<std::vector<char>> inputs_;
  std::vector<const void*> ptrs_;
  std::vector<char> reference_;
};

}  // namespace

void TableCases(Bench& bench, const OpSpec& op) {
  std::vector<std::vector<std::vector<int64_t>>> cases = op.test.large_shapes;
  if (cases.empty() && !op.test.edge_shapes.empty()) cases = {op.test.edge_shapes.back()};
  if (bench.opt().quick && cases.size() > 1) cases.resize(1);
  for (const auto& shapes : cases) {
    const std::string label = Label(shapes);
    if (!bench.WantShape(label)) continue;
    for (DType dtype : op.dtypes) {
      std::vector<TensorMeta> inputs;
      for (const auto& s : shapes) inputs.push_back({dtype, s});
      std::optional<Case> c = bench.CaseIfServed(op.name, inputs, label);
      if (!c) continue;
      Sets sets(c->inputs, c->output, bench.stream());
      const Row stream = Bench::CeilingAnchor("read_stream", bench.report().stream_gbps);
      ReferenceCheck check(*c, sets);
      bench.RunTableAlgorithms(*c, sets, {}, &stream, std::ref(check), {});
    }
  }
}

}  // namespace opserve::bench
