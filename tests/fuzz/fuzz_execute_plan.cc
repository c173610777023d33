// Fuzz target: the validation and planning of an ExecuteRequest.
//
// Bytes -> v1::ExecuteRequest (ParseFromArray) -> BuildPlan against the CPU backend and a store
// seeded with a few tensors, in two namespaces. Beyond "no crash, leak or hang" it checks what a
// plan promises the executor:
//   - every node is planned once, in topological order, with the op's arity, and an algorithm of
//     the cpu backend that runs the input dtype;
//   - input indices are in range and their metadata is what the node was planned with;
//   - a stored input is a tensor of the caller's namespace, never another's;
//   - every output passes CheckMeta under the limits; returned bytes fit a message;
//   - an error is INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED or UNIMPLEMENTED
//     with a message, never anything else.
// A plan that is cheap to run (small outputs, few FLOPs) is then executed on the CPU backend:
// it must succeed, return what it promised, and give every byte back to the memory budget.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "opserve/v1/opserve.pb.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/executor.h"
#include "server/engine/plan.h"
#include "server/engine/tensor_store.h"
#include "server/rpc/convert.h"
#include "tests/fuzz/fuzz_check.h"

namespace opserve {
namespace {

// gRPC's default receive limit is 4 MiB; nothing a fuzzer reaches needs more than this.
constexpr size_t kMaxInputBytes = 1 << 20;
constexpr char kTenant[] = "tenant";

// Execution bounds: keep each run in the millisecond range under ASan.
constexpr uint64_t kMaxExecOutputBytes = 64 << 10;
constexpr uint64_t kMaxExecFlops = 1 << 22;

const absl::StatusCode kRefusals[] = {
    absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
    absl::StatusCode::kAlreadyExists, absl::StatusCode::kResourceExhausted,
    absl::StatusCode::kUnimplemented};

struct Fixture {
  std::unique_ptr<Backend> backend = MakeCpuBackend(64 << 20);
  TensorStore store;
  // The server's defaults, but for max_tensor_bytes (the budget there, half of RAM).
  Limits limits{/*max_tensor_bytes=*/uint64_t{1} << 40, /*max_graph_nodes=*/256,
                /*max_message_bytes=*/256 << 20};
  std::vector<StoredTensorPtr> visible;  // namespace ""
  std::vector<StoredTensorPtr> tenant;   // namespace kTenant
  // Metadata of 1 GiB over a 64-byte buffer: shape inference sees large dimensions, and plans
  // that read it are never executed.
  StoredTensorPtr big;

  StoredTensorPtr Seed(const std::string& name, DType dtype, std::vector<int64_t> shape,
                       const std::string& ns, bool fake_size = false) {
    TensorMeta meta{dtype, std::move(shape)};
    const uint64_t bytes = fake_size ? 64 : meta.Bytes();
    BufferPtr buffer = *backend->Allocate(bytes);
    // Finite, varied values: 0.5, 1.5, ... as float32, small integers otherwise.
    for (uint64_t i = 0; i < bytes; ++i) static_cast<unsigned char*>(buffer->data())[i] = 0;
    for (uint64_t i = 0; i * 4 + 3 < bytes; ++i) {
      const float f = 0.5f + static_cast<float>(i % 7);
      const uint32_t u =
          dtype == DType::kFloat32 ? std::bit_cast<uint32_t>(f) : static_cast<uint32_t>(i % 5);
      static_cast<uint32_t*>(buffer->data())[i] = u;
    }
    auto t = std::make_shared<StoredTensor>(StoredTensor{name, std::move(meta), std::move(buffer)});
    if (!store.InsertAll({t}, {false}, ns).ok()) std::abort();
    (ns.empty() ? visible : tenant).push_back(t);
    return t;
  }

  Fixture() {
    Seed("A", DType::kFloat32, {4, 8}, "");
    Seed("B", DType::kFloat32, {8, 4}, "");
    Seed("I", DType::kInt32, {16}, "");
    Seed("H", DType::kBFloat16, {8, 8}, "");
    Seed("L", DType::kInt64, {3, 5}, "");
    Seed("S", DType::kFloat32, {}, "");
    big = Seed("big", DType::kFloat32, {1 << 16, 1 << 12}, "", /*fake_size=*/true);
    // Same name as a tensor of "", different shape: a plan must pick the caller's.
    Seed("A", DType::kFloat32, {3, 3}, kTenant);
    Seed("secret", DType::kFloat32, {2, 2}, kTenant);
  }
};

Fixture& F() {
  static Fixture* f = new Fixture();
  return *f;
}

bool Contains(const std::vector<StoredTensorPtr>& v, const StoredTensor* t) {
  for (const auto& x : v) {
    if (x.get() == t) return true;
  }
  return false;
}

bool Accepts(const AlgoSpec& a, DType d) {
  for (DType x : a.dtypes) {
    if (x == d) return true;
  }
  return false;
}

// Checks the plan against the request; returns whether it is cheap enough to execute.
bool CheckPlan(const v1::ExecuteRequest& request, const Plan& plan, const std::string& ns) {
  Fixture& f = F();
  const std::vector<StoredTensorPtr>& mine = ns.empty() ? f.visible : f.tenant;
  FUZZ_CHECK(plan.tenant == ns, plan.tenant);
  FUZZ_CHECK(static_cast<int>(plan.nodes.size()) == request.nodes_size(),
             absl::StrCat(plan.nodes.size(), " planned of ", request.nodes_size()));
  FUZZ_CHECK(plan.inlines.size() == static_cast<size_t>(request.inline_tensors_size()),
             absl::StrCat(plan.inlines.size(), " inlines of ", request.inline_tensors_size()));
  for (const PlanInline& pi : plan.inlines) {
    FUZZ_CHECK(pi.data.size() == pi.meta.Bytes(), pi.name);
    FUZZ_CHECK(CheckMeta(pi.meta, f.limits.max_tensor_bytes, "inline").ok(), pi.meta.DebugString());
  }
  std::set<std::string> ids;
  bool cheap = true;
  uint64_t flops = 0, returned = 0;
  for (size_t p = 0; p < plan.nodes.size(); ++p) {
    const PlanNode& n = plan.nodes[p];
    const std::string at = absl::StrCat("node ", p, " '", n.id, "'");
    FUZZ_CHECK(ids.insert(n.id).second, at + " planned twice");
    FUZZ_CHECK(n.op != nullptr && n.algo != nullptr, at);
    FUZZ_CHECK(n.algo->op == n.op->name && n.algo->backend == "cpu", at);
    // A fused node reads the inputs of the node fused into it: the rule's inner op's arity. The
    // node fused into another runs nothing, leaves the request nowhere, and names a later node of
    // the same rule.
    int arity = n.op->arity;
    if (!n.fusion.empty()) {
      const FusionRule* rule = nullptr;
      for (const FusionRule& r : FusionRules()) {
        if (r.name == n.fusion) rule = &r;
      }
      FUZZ_CHECK(rule != nullptr, at + " fused by an unknown rule");
      if (n.fused_into < 0) {
        FUZZ_CHECK(rule->outer == n.op->name, at);
        arity = FindOp(rule->inner)->arity;
      } else {
        FUZZ_CHECK(rule->inner == n.op->name, at);
        FUZZ_CHECK(n.fused_into > static_cast<int>(p) &&
                       n.fused_into < static_cast<int>(plan.nodes.size()) &&
                       plan.nodes[n.fused_into].fusion == n.fusion &&
                       plan.nodes[n.fused_into].fused_into < 0,
                   at);
        FUZZ_CHECK(!n.returned && n.store_as.empty() && n.last_use == -1, at);
      }
    } else {
      FUZZ_CHECK(n.fused_into < 0, at);
    }
    FUZZ_CHECK(static_cast<int>(n.inputs.size()) == arity && n.input_meta.size() == n.inputs.size(),
               at);
    FUZZ_CHECK(Accepts(*n.algo, n.input_meta[0].dtype), at);
    FUZZ_CHECK(n.last_use == -1 || n.last_use > static_cast<int>(p), at);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const PlanInput& in = n.inputs[j];
      const std::string atj = absl::StrCat(at, " input ", j);
      switch (in.source) {
        case PlanInput::Source::kStored:
          FUZZ_CHECK(in.stored != nullptr, atj);
          FUZZ_CHECK(Contains(mine, in.stored.get()),
                     atj + ": a stored tensor outside the caller's namespace");
          FUZZ_CHECK(in.stored->meta == n.input_meta[j], atj);
          if (in.stored == f.big) cheap = false;
          break;
        case PlanInput::Source::kInline:
          FUZZ_CHECK(in.index >= 0 && in.index < static_cast<int>(plan.inlines.size()), atj);
          FUZZ_CHECK(plan.inlines[in.index].meta == n.input_meta[j], atj);
          break;
        case PlanInput::Source::kNode:
          // Topological order: a producer comes first, and lives at least until this reader.
          FUZZ_CHECK(in.index >= 0 && in.index < static_cast<int>(p), atj);
          FUZZ_CHECK(plan.nodes[in.index].output == n.input_meta[j], atj);
          FUZZ_CHECK(plan.nodes[in.index].last_use >= static_cast<int>(p), atj);
          break;
      }
    }
    FUZZ_CHECK(CheckMeta(n.output, f.limits.max_tensor_bytes, "output").ok(),
               at + " " + n.output.DebugString());
    for (const PlanNode::Store& s : n.store_as) {
      FUZZ_CHECK(CheckTensorName(s.name, "store_as").ok(), at + " stores as " + s.name);
    }
    if (n.returned) returned += n.output.Bytes();
    if (n.output.Bytes() > kMaxExecOutputBytes) cheap = false;
    if (n.fused_into < 0) flops += n.cost.flops;  // a fused pair's work counted once
  }
  FUZZ_CHECK(returned <= f.limits.max_message_bytes, absl::StrCat(returned, " bytes returned"));
  // Kahn's order may differ from the request's; every request node must still be there.
  for (const v1::Node& node : request.nodes()) FUZZ_CHECK(ids.count(node.id()) == 1, node.id());
  return cheap && flops <= kMaxExecFlops;
}

// Runs a checked plan on a private copy of the store, so that store_as outputs do not pile up
// from one input to the next.
void Execute(const Plan& plan, const std::string& ns) {
  Fixture& f = F();
  const uint64_t used_before = f.backend->Memory().used;
  {
    TensorStore store;
    if (!f.visible.empty()) {
      FUZZ_CHECK(store.InsertAll(f.visible, std::vector<bool>(f.visible.size(), false), "").ok(),
                 "seed");
    }
    FUZZ_CHECK(store.InsertAll(f.tenant, std::vector<bool>(f.tenant.size(), false), kTenant).ok(),
               "seed");
    auto env = f.backend->NewExecEnv();
    FUZZ_CHECK(env.ok(), env.status().ToString());
    ExecuteResult result;
    const absl::Status s =
        ExecutePlan(plan, *f.backend, **env, store, /*metrics=*/nullptr, {}, &result);
    v1::ExecuteResponse response;
    if (s.ok()) convert::ResultToProto(std::move(result), &response);
    FUZZ_CHECK(s.ok(), "a plan BuildPlan accepted failed to run: " + s.ToString());
    FUZZ_CHECK(response.nodes_size() == static_cast<int>(plan.nodes.size()),
               absl::StrCat(response.nodes_size()));
    size_t returned = 0, stored = 0;
    for (const PlanNode& n : plan.nodes) {
      returned += n.returned ? 1 : 0;
      stored += n.store_as.size();
    }
    FUZZ_CHECK(static_cast<size_t>(response.outputs_size()) == returned,
               absl::StrCat(response.outputs_size(), " outputs, expected ", returned));
    FUZZ_CHECK(static_cast<size_t>(response.stored_size()) == stored,
               absl::StrCat(response.stored_size(), " stored, expected ", stored));
    for (const v1::NamedTensor& out : response.outputs()) {
      TensorMeta meta{static_cast<DType>(out.tensor().dtype()),
                      {out.tensor().shape().begin(), out.tensor().shape().end()}};
      FUZZ_CHECK(out.tensor().data().size() == meta.Bytes(), out.node());
    }
    for (const v1::TensorInfo& info : response.stored()) {
      auto t = store.Get(info.name(), ns);
      FUZZ_CHECK(t.ok() && (*t)->meta.Bytes() == info.bytes(), "stored output " + info.name());
    }
  }
  // The private store, the response and the ExecEnv are gone: every intermediate, inline upload
  // and stored output must be back in the budget.
  FUZZ_CHECK(f.backend->Memory().used == used_before,
             absl::StrCat("memory budget leak: ", used_before, " bytes in use before, ",
                          f.backend->Memory().used, " after"));
}

}  // namespace
}  // namespace opserve

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  opserve::fuzz::SilenceProtobufLogs();
  opserve::F();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserve;
  if (size > kMaxInputBytes) return 0;
  v1::ExecuteRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  Fixture& f = F();
  for (const std::string ns : {"", kTenant}) {
    absl::StatusOr<Plan> plan = BuildPlan(convert::GraphFromProto(request), *f.backend, f.store, f.limits, ns);
    if (!plan.ok()) {
      FUZZ_CHECK(fuzz::ErrorIsOneOf(plan.status(), kRefusals),
                 plan.status().ToString());
      continue;
    }
    if (CheckPlan(request, *plan, ns) && ns.empty()) Execute(*plan, ns);
  }
  return 0;
}
