#include "server/engine/batch.h"

#include <utility>

namespace opserve {

bool Batchable(const Plan& plan) {
  uint64_t bytes = 0;
  for (const PlanNode& n : plan.nodes) {
    if (!n.store_as.empty() || n.host_dest != nullptr || n.device_dest != nullptr) return false;
    bytes += n.cost.bytes;
  }
  return bytes <= kMaxBatchableBytes;
}

Plan MergePlans(std::span<const Plan* const> plans) {
  Plan merged;
  if (plans.empty()) return merged;
  merged.tenant = plans.front()->tenant;
  for (const Plan* p : plans) {
    const int node_base = static_cast<int>(merged.nodes.size());
    const int inline_base = static_cast<int>(merged.inlines.size());
    merged.inlines.insert(merged.inlines.end(), p->inlines.begin(), p->inlines.end());
    for (PlanNode n : p->nodes) {
      for (PlanInput& in : n.inputs) {
        if (in.source == PlanInput::Source::kInline) in.index += inline_base;
        if (in.source == PlanInput::Source::kNode) in.index += node_base;
      }
      if (n.last_use >= 0) n.last_use += node_base;
      if (n.fused_into >= 0) n.fused_into += node_base;
      merged.nodes.push_back(std::move(n));
    }
  }
  merged.signature = PlanSignature(merged);
  return merged;
}

std::vector<ExecuteResult> SplitResult(ExecuteResult merged, std::span<const Plan* const> plans) {
  std::vector<ExecuteResult> parts(plans.size());
  size_t node = 0, output = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    ExecuteResult& r = parts[i];
    r.input_us = merged.input_us;
    r.compute_us = merged.compute_us;
    r.output_us = merged.output_us;
    r.device = merged.device;
    r.replay = merged.replay;
    r.batch_size = static_cast<int>(plans.size());
    for (const PlanNode& n : plans[i]->nodes) {
      if (node < merged.nodes.size()) r.nodes.push_back(std::move(merged.nodes[node]));
      ++node;
      // CompletePlan returns the outputs in node order.
      if (n.returned && output < merged.outputs.size()) {
        r.outputs.push_back(std::move(merged.outputs[output++]));
      }
    }
  }
  return parts;
}

}  // namespace opserve
