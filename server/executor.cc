#include "server/executor.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/status_macros.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

bool HasEmptyInput(const PlanNode& n) {
  for (const TensorMeta& m : n.input_meta) {
    if (m.NumElements() == 0) return true;
  }
  return false;
}

void FillShape(const TensorMeta& meta, v1::Tensor* t) {
  t->set_dtype(static_cast<v1::DType>(meta.dtype));
  for (int64_t d : meta.shape) t->add_shape(d);
}

}  // namespace

absl::Status ExecutePlan(const Plan& plan, const ExecuteContext& ctx,
                         v1::ExecuteResponse* response) {
  Backend& backend = *ctx.backend;
  v1::RequestTiming* timing = response->mutable_timing();

  ctx.env->BeginRequest();
  // Inputs: upload each inline tensor that a node reads, once.
  auto t_input = Clock::now();
  std::vector<BufferPtr> inline_buffers(plan.inlines.size());
  for (const PlanNode& n : plan.nodes) {
    for (const PlanInput& in : n.inputs) {
      if (in.source != PlanInput::Source::kInline || inline_buffers[in.index]) continue;
      const PlanInline& pi = plan.inlines[in.index];
      auto buffer = ctx.env->Allocate(pi.meta.Bytes());
      if (!buffer.ok()) {
        return absl::Status(buffer.status().code(), absl::StrCat("inline tensor ", Quote(pi.name),
                                                                  ": ", buffer.status().message()));
      }
      RETURN_IF_ERROR(ctx.env->CopyIn(**buffer, pi.data->data(), pi.data->size()));
      inline_buffers[in.index] = *std::move(buffer);
    }
  }
  timing->set_input_us(MicrosSince(t_input));

  // Compute: every node in order; an intermediate's buffer goes back after its last reader.
  auto t_compute = Clock::now();
  const int num_nodes = static_cast<int>(plan.nodes.size());
  std::vector<BufferPtr> outputs(num_nodes);
  std::vector<bool> skipped(num_nodes, false);  // empty inputs: no kernel ran
  std::vector<const void*> ptrs;
  for (int i = 0; i < num_nodes; ++i) {
    const PlanNode& n = plan.nodes[i];
    auto at = [&](const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat("node '", n.id, "' (", std::string(n.op->name), "/",
                                                 std::string(n.algo->name), "): ", s.message()));
    };
    // Keep at most the running node and this one on the device: a request abandoned below
    // (deadline, cancellation) then waits for no more than that before its buffers go back.
    if (i >= 2) {
      if (auto s = ctx.env->WaitNode(i - 2); !s.ok()) {
        (void)ctx.env->Finish(i);
        return at(s);
      }
    }
    if (ctx.check_alive) {
      if (auto s = ctx.check_alive(); !s.ok()) {
        (void)ctx.env->Finish(i);  // drain the device before buffers go back
        return at(s);
      }
    }
    auto out = ctx.env->Allocate(n.output.Bytes());
    if (!out.ok()) return at(out.status());
    outputs[i] = *std::move(out);
    ptrs.clear();
    for (const PlanInput& in : n.inputs) {
      switch (in.source) {
        case PlanInput::Source::kStored: ptrs.push_back(in.stored->buffer->data()); break;
        case PlanInput::Source::kInline: ptrs.push_back(inline_buffers[in.index]->data()); break;
        case PlanInput::Source::kNode: ptrs.push_back(outputs[in.index]->data()); break;
      }
    }
    // Every node is marked, a skipped one too: Finish and WaitNode read each node's marks.
    absl::Status s;
    ctx.env->MarkStart(i);
    if (HasEmptyInput(n)) {
      // No kernel runs on zero elements: the output (zeros, or NaNs for a mean) is filled, and the
      // node reports the algorithm that would have run with a kernel time of 0.
      skipped[i] = true;
      s = ctx.env->Fill(*outputs[i], n.op->empty_fill == EmptyFill::kNaN ? 0xFF : 0,
                        n.output.Bytes());
    } else {
      KernelArgs args{ptrs, n.input_meta, outputs[i]->data(), n.output, n.attrs, *ctx.env};
      s = n.algo->run(args);
#if OPSERVE_TEST_HOOKS
      if (!ctx.fail_algorithm.empty() &&
          ctx.fail_algorithm ==
              absl::StrCat(std::string(n.op->name), "/", std::string(n.algo->name))) {
        s = ctx.env->InjectFault();
      }
#endif
    }
    ctx.env->MarkEnd(i);
    if (!s.ok()) {
      (void)ctx.env->Finish(i + 1);  // drain the device before buffers go back
      return at(s);
    }
    for (const PlanInput& in : n.inputs) {
      if (in.source != PlanInput::Source::kNode) continue;
      const PlanNode& src = plan.nodes[in.index];
      if (src.last_use == i && !src.returned && src.store_as.empty()) outputs[in.index].reset();
    }
  }
  // A request abandoned during its last node stages and stores nothing.
  if (ctx.check_alive) {
    if (auto s = ctx.check_alive(); !s.ok()) {
      (void)ctx.env->Finish(num_nodes);
      return s;
    }
  }
  // Returned outputs go to host memory in stream order: the one wait below covers them.
  std::vector<const void*> staged(num_nodes, nullptr);
  for (int i = 0; i < num_nodes; ++i) {
    if (!plan.nodes[i].returned) continue;
    auto p = ctx.env->StageOut(*outputs[i], plan.nodes[i].output.Bytes());
    if (!p.ok()) {
      (void)ctx.env->Finish(num_nodes);
      return p.status();
    }
    staged[i] = *p;
  }
  auto seconds = ctx.env->Finish(num_nodes);
  if (!seconds.ok()) {
    // Kernels run asynchronously: a device error surfaces here, after all launches.
    std::string ids;
    for (const PlanNode& n : plan.nodes) absl::StrAppend(&ids, ids.empty() ? "'" : ", '", n.id, "'");
    return absl::Status(seconds.status().code(), absl::StrCat("device error while running node(s) ", ids,
                                                              ": ", seconds.status().message()));
  }
  timing->set_compute_us(MicrosSince(t_compute));

  for (int i = 0; i < num_nodes; ++i) {
    const PlanNode& n = plan.nodes[i];
    const double s = skipped[i] ? 0.0 : (*seconds)[i];
    v1::NodeResult* r = response->add_nodes();
    r->set_id(n.id);
    r->set_op(std::string(n.op->name));
    r->set_algorithm(std::string(n.algo->name));
    r->set_dtype(static_cast<v1::DType>(n.output.dtype));
    for (int64_t d : n.output.shape) r->add_shape(d);
    r->set_kernel_us(s * 1e6);
    r->set_bytes(n.cost.bytes);
    r->set_flops(n.cost.flops);
    r->set_gbps(s > 0 ? n.cost.bytes / s / 1e9 : 0);
    r->set_gflops(s > 0 ? n.cost.flops / s / 1e9 : 0);
    if (ctx.metrics && !skipped[i]) ctx.metrics->RecordKernel(std::string_view(n.op->name.data(), n.op->name.size()),
                                  std::string_view(n.algo->name.data(), n.algo->name.size()), s, n.cost.bytes, n.cost.flops);
  }

  // Outputs: returned inline, and kept under their names (all or none).
  auto t_output = Clock::now();
  std::vector<StoredTensorPtr> to_store;
  std::vector<bool> overwrite;
  for (int i = 0; i < num_nodes; ++i) {
    const PlanNode& n = plan.nodes[i];
    if (n.returned) {
      v1::NamedTensor* nt = response->add_outputs();
      nt->set_node(n.id);
      v1::Tensor* t = nt->mutable_tensor();
      FillShape(n.output, t);
      std::string* data = t->mutable_data();
      data->resize(n.output.Bytes());
      if (staged[i] != nullptr) {
        if (!data->empty()) std::memcpy(data->data(), staged[i], data->size());
      } else {
        RETURN_IF_ERROR(backend.CopyOut(*outputs[i], 0, data->data(), data->size()));
      }
    }
    for (const PlanNode::Store& st : n.store_as) {
      to_store.push_back(std::make_shared<StoredTensor>(StoredTensor{st.name, n.output, outputs[i]}));
      overwrite.push_back(st.overwrite);
    }
  }
  // The stored outputs' infos still follow: allow for them, then commit.
  const uint64_t response_bytes = response->ByteSizeLong() + 512 * to_store.size();
  if (response_bytes > ctx.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response would be ", response_bytes, " bytes, over the limit of ",
        ctx.max_response_bytes, " (--max_message_bytes); store the outputs and use GetTensor"));
  }
  if (!to_store.empty()) {
    // The liveness check runs under the store's lock: a request that died after its last node
    // (its deadline passed while the device finished, or the client cancelled) stores nothing.
    RETURN_IF_ERROR(ctx.store->InsertAll(to_store, overwrite, plan.ns, ctx.check_alive));
    for (const StoredTensorPtr& t : to_store) {
      v1::TensorInfo* info = response->add_stored();
      info->set_name(t->name);
      info->set_dtype(static_cast<v1::DType>(t->meta.dtype));
      for (int64_t d : t->meta.shape) info->add_shape(d);
      info->set_bytes(t->meta.Bytes());
      info->set_device(backend.device());
    }
  }
  timing->set_output_us(MicrosSince(t_output));
  response->set_device(backend.device());
  return absl::OkStatus();
}

}  // namespace opserve
