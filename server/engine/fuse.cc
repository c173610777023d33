#include "server/engine/fuse.h"

#include <vector>

namespace opserve {
namespace {

// Where node `inner`'s output goes: only to `outer`, as its one input, and nowhere else.
bool OnlyFeeds(const Plan& plan, int inner, int outer) {
  const PlanNode& n = plan.nodes[inner];
  if (n.returned || !n.store_as.empty() || n.host_dest != nullptr || n.device_dest) return false;
  int reads = 0;
  for (int i = 0; i < static_cast<int>(plan.nodes.size()); ++i) {
    if (plan.nodes[i].fused_into >= 0) continue;
    for (const PlanInput& in : plan.nodes[i].inputs) {
      if (in.source == PlanInput::Source::kNode && in.index == inner) {
        if (i != outer) return false;
        ++reads;
      }
    }
  }
  return reads == 1;
}

void RecomputeLastUse(Plan& plan) {
  for (PlanNode& n : plan.nodes) n.last_use = -1;
  for (int i = 0; i < static_cast<int>(plan.nodes.size()); ++i) {
    if (plan.nodes[i].fused_into >= 0) continue;  // runs nothing, reads nothing
    for (const PlanInput& in : plan.nodes[i].inputs) {
      if (in.source == PlanInput::Source::kNode) plan.nodes[in.index].last_use = i;
    }
  }
}

}  // namespace

void FusePlan(Plan& plan, const DeviceProperties& device) {
  for (int o = static_cast<int>(plan.nodes.size()) - 1; o >= 0; --o) {
    PlanNode& outer = plan.nodes[o];
    if (!outer.fusable || !outer.fusion.empty() || outer.fused_into >= 0) continue;
    if (outer.inputs.size() != 1 || outer.inputs[0].source != PlanInput::Source::kNode) continue;
    const int i = outer.inputs[0].index;
    PlanNode& inner = plan.nodes[i];
    if (!inner.fusable || !inner.fusion.empty() || !OnlyFeeds(plan, i, o)) continue;
    for (const FusionRule& rule : FusionRules()) {
      if (rule.outer != outer.op->name || rule.inner != inner.op->name) continue;
      const AlgoSpec* kernel = FusedKernel(rule, inner.input_meta, outer.output, device);
      if (kernel == nullptr) continue;
      uint64_t bytes = outer.output.Bytes();
      for (const TensorMeta& m : inner.input_meta) bytes += m.Bytes();
      outer.cost = {bytes, inner.cost.flops + outer.cost.flops};
      outer.inputs = inner.inputs;
      outer.input_meta = inner.input_meta;
      outer.algo = kernel;
      outer.fusion = rule.name;
      inner.fusion = rule.name;
      inner.fused_into = o;
      inner.cost = outer.cost;
      break;
    }
  }
  RecomputeLastUse(plan);
}

}  // namespace opserve
