#include "server/engine/executor.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace opserve {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// A node's output: kept under a name, it must outlive the request; otherwise it is transient.
absl::StatusOr<BufferPtr> Allocate(ExecEnv& env, const PlanNode& n) {
  return n.store_as.empty() ? env.AllocateTransient(n.output.Bytes()) : env.Allocate(n.output.Bytes());
}

bool HasEmptyInput(const PlanNode& n) {
  for (const TensorMeta& m : n.input_meta) {
    if (m.NumElements() == 0) return true;
  }
  return false;
}

}  // namespace

absl::Status LaunchPlan(const Plan& plan, ExecEnv& env, Metrics* metrics,
                        const ExecuteOptions& options, LaunchState* launch,
                        ExecuteResult* result) {
  env.BeginRequest(static_cast<int>(plan.nodes.size()));
  // Inputs: upload each inline tensor that a node reads, once.
  auto t_input = Clock::now();
  std::vector<BufferPtr>& inline_buffers = launch->inline_buffers;
  inline_buffers.assign(plan.inlines.size(), nullptr);
  for (const PlanNode& n : plan.nodes) {
    for (const PlanInput& in : n.inputs) {
      if (in.source != PlanInput::Source::kInline || inline_buffers[in.index]) continue;
      const PlanInline& pi = plan.inlines[in.index];
      if (pi.device) {  // already on the device: read in place
        inline_buffers[in.index] = pi.device;
        continue;
      }
      auto buffer = env.AllocateTransient(pi.meta.Bytes());
      if (!buffer.ok()) {
        (void)env.Finish(0);  // the copies already queued finish before their buffers go back
        return absl::Status(buffer.status().code(), absl::StrCat("inline tensor ", Quote(pi.name),
                                                                  ": ", buffer.status().message()));
      }
      if (absl::Status s = env.CopyIn(**buffer, pi.data.data(), pi.data.size()); !s.ok()) {
        (void)env.Finish(0);
        return absl::Status(s.code(), absl::StrCat("inline tensor ", Quote(pi.name), ": ", s.message()));
      }
      inline_buffers[in.index] = *std::move(buffer);
    }
  }
  result->input_us = MicrosSince(t_input);

  launch->compute_start = Clock::now();
  const int num_nodes = static_cast<int>(plan.nodes.size());
  std::vector<BufferPtr>& outputs = launch->outputs;
  outputs.assign(num_nodes, nullptr);
  std::vector<bool>& skipped = launch->skipped;
  skipped.assign(num_nodes, false);
  // A node fused into another runs nothing (and so fills nothing either).
  for (int i = 0; i < num_nodes; ++i) {
    skipped[i] = plan.nodes[i].fused_into < 0 && HasEmptyInput(plan.nodes[i]);
  }
  auto at = [&](int i, const absl::Status& s) {
    const PlanNode& n = plan.nodes[i];
    return absl::Status(s.code(), absl::StrCat("node '", n.id, "' (", std::string(n.op->name), "/",
                                               std::string(n.algo->name), "): ", s.message()));
  };
  // Queues node i between its timing marks, on the buffers allocated for it.
  std::vector<const void*> ptrs;
  auto launch_node = [&](int i) -> absl::Status {
    const PlanNode& n = plan.nodes[i];
    if (n.fused_into >= 0) {  // its work is in the fused node's kernel; marked for the timing
      env.MarkStart(i);
      env.MarkEnd(i);
      return absl::OkStatus();
    }
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
    env.MarkStart(i);
    if (skipped[i]) {
      // No kernel runs on zero elements: the output (zeros, or NaNs for a mean) is filled, and the
      // node reports the algorithm that would have run with a kernel time of 0.
      s = env.Fill(*outputs[i], n.op->empty_fill == EmptyFill::kNaN ? 0xFF : 0, n.output.Bytes());
    } else {
      KernelArgs args{ptrs, n.input_meta, outputs[i]->data(), n.output, n.attrs, env};
      s = n.algo->run(args);
#if OPSERVE_TEST_HOOKS
      if (!options.fail_algorithm.empty() &&
          options.fail_algorithm ==
              absl::StrCat(std::string(n.op->name), "/", std::string(n.algo->name))) {
        s = env.InjectFault();
      }
#endif
    }
    env.MarkEnd(i);
    return s;
  };

  // Returned outputs go to host memory in stream order, so the request's one wait covers them.
  // Their places are reserved first: in a graph the copies are nodes too, and the places among
  // its bindings. An output with a host destination is copied there after the wait
  // (CompletePlan), as is one the staging area cannot hold.
  std::vector<void*>& staged = launch->staged;
  staged.assign(num_nodes, nullptr);
  for (int i = 0; i < num_nodes; ++i) {
    if (!plan.nodes[i].returned || plan.nodes[i].host_dest != nullptr) continue;
    auto p = env.ReserveStaging(plan.nodes[i].output.Bytes());
    if (!p.ok()) {
      (void)env.Finish(0);
      return p.status();
    }
    staged[i] = *p;
  }
  auto stage_outputs = [&]() -> absl::Status {
    for (int i = 0; i < num_nodes; ++i) {
      if (staged[i] == nullptr) continue;
      RETURN_IF_ERROR(env.CopyToStaging(*outputs[i], staged[i], plan.nodes[i].output.Bytes()));
    }
    return absl::OkStatus();
  };

  // As one CUDA graph where the device has a graph cache. Every output is allocated first:
  // allocations are not captured, and the graph's intermediates live until the request ends.
  // When they do not fit the budget together, the graph runs node by node instead, where each
  // intermediate goes back after its last reader.
  // A single node too: besides its kernel it has timing marks and the copy of its output, and
  // one graph launch queues them all for less host time than those calls take one by one.
  bool as_graph = env.LaunchesGraphs();
  for (int i = 0; as_graph && i < num_nodes; ++i) {
    if (plan.nodes[i].fused_into >= 0) continue;  // no output of its own
    if (plan.nodes[i].device_dest) {
      outputs[i] = plan.nodes[i].device_dest;
      continue;
    }
    auto out = Allocate(env, plan.nodes[i]);
    if (!out.ok()) {
      outputs.assign(num_nodes, nullptr);  // unused: back in stream order at once
      if (out.status().code() == absl::StatusCode::kResourceExhausted) {
        as_graph = false;
        break;
      }
      (void)env.Finish(0);
      return at(i, out.status());
    }
    outputs[i] = *std::move(out);
  }
  if (as_graph) {
    if (options.check_alive) {
      if (auto s = options.check_alive(); !s.ok()) {
        (void)env.Finish(0);
        return s;
      }
    }
    std::vector<const void*> bindings;
    for (int i = 0; i < num_nodes; ++i) {
      for (const PlanInput& in : plan.nodes[i].inputs) {
        if (in.source == PlanInput::Source::kStored) bindings.push_back(in.stored->buffer->data());
        if (in.source == PlanInput::Source::kInline) bindings.push_back(inline_buffers[in.index]->data());
      }
      if (outputs[i]) bindings.push_back(outputs[i]->data());
      if (staged[i]) bindings.push_back(staged[i]);
    }
    int failed = -1;
    auto replay = env.LaunchAsGraph(plan.signature, bindings, [&]() -> absl::Status {
      for (int i = 0; i < num_nodes; ++i) {
        if (absl::Status s = launch_node(i); !s.ok()) {
          failed = i;
          return s;
        }
      }
      return stage_outputs();
    });
    if (!replay.ok()) {
      (void)env.Finish(num_nodes);  // drain the device before buffers go back
      return failed >= 0 ? at(failed, replay.status()) : replay.status();
    }
    result->replay = *replay;
    if (metrics != nullptr) {
      metrics->RecordGraph(*replay == GraphReplay::kReplayed   ? "hit"
                           : *replay == GraphReplay::kRebound  ? "rebound"
                           : *replay == GraphReplay::kCaptured ? "miss"
                                                                : "direct");
    }
  } else {
    if (metrics != nullptr && env.LaunchesGraphs()) {
      metrics->RecordGraph("direct");
    }
    // Node by node; an intermediate's buffer goes back after its last reader.
    for (int i = 0; i < num_nodes; ++i) {
      const PlanNode& n = plan.nodes[i];
      // Keep at most the running node and this one on the device: a request abandoned below
      // (deadline, cancellation) then waits for no more than that before its buffers go back.
      if (i >= 2) {
        if (auto s = env.WaitNode(i - 2); !s.ok()) {
          (void)env.Finish(i);
          return at(i, s);
        }
      }
      if (options.check_alive) {
        if (auto s = options.check_alive(); !s.ok()) {
          (void)env.Finish(i);  // drain the device before buffers go back
          return at(i, s);
        }
      }
      if (n.fused_into >= 0) {
        if (absl::Status s = launch_node(i); !s.ok()) {
          (void)env.Finish(i + 1);
          return at(i, s);
        }
        continue;
      }
      auto out = n.device_dest ? absl::StatusOr<BufferPtr>(n.device_dest) : Allocate(env, n);
      if (!out.ok()) {
        // Drain first: the nodes already queued read stored tensors this request holds, and a
        // tensor deleted meanwhile goes back to the pool when the request lets go of it.
        (void)env.Finish(i);
        return at(i, out.status());
      }
      outputs[i] = *std::move(out);
      if (absl::Status s = launch_node(i); !s.ok()) {
        (void)env.Finish(i + 1);  // drain the device before buffers go back
        return at(i, s);
      }
      for (const PlanInput& in : n.inputs) {
        if (in.source != PlanInput::Source::kNode) continue;
        const PlanNode& src = plan.nodes[in.index];
        if (src.last_use == i && !src.returned && src.store_as.empty()) outputs[in.index].reset();
      }
    }
    // A request abandoned during its last node stages and stores nothing.
    if (options.check_alive) {
      if (auto s = options.check_alive(); !s.ok()) {
        (void)env.Finish(num_nodes);
        return s;
      }
    }
    if (absl::Status s = stage_outputs(); !s.ok()) {
      (void)env.Finish(num_nodes);
      return s;
    }
  }
  if (absl::Status s = env.Launched(); !s.ok()) {
    (void)env.Finish(num_nodes);
    return s;
  }
  return absl::OkStatus();
}

absl::Status CompletePlan(const Plan& plan, Backend& backend, ExecEnv& env, TensorStore& store,
                          Metrics* metrics, const ExecuteOptions& options, LaunchState& launch,
                          ExecuteResult* result) {
  const int num_nodes = static_cast<int>(plan.nodes.size());
  std::vector<BufferPtr>& outputs = launch.outputs;
  const std::vector<bool>& skipped = launch.skipped;
  const std::vector<void*>& staged = launch.staged;
  auto seconds = env.Finish(num_nodes);
  if (!seconds.ok()) {
    // Kernels run asynchronously: a device error surfaces here, after all launches.
    std::string ids;
    for (const PlanNode& n : plan.nodes) absl::StrAppend(&ids, ids.empty() ? "'" : ", '", n.id, "'");
    return absl::Status(seconds.status().code(), absl::StrCat("device error while running node(s) ", ids,
                                                              ": ", seconds.status().message()));
  }
  result->compute_us = MicrosSince(launch.compute_start);

  for (int i = 0; i < num_nodes; ++i) {
    const PlanNode& n = plan.nodes[i];
    // A node fused into another reports that node's kernel: its time and cost, counted once
    // (there, in the metrics and in the fused node's report).
    const int ran = n.fused_into >= 0 ? n.fused_into : i;
    const double s = skipped[ran] ? 0.0 : (*seconds)[ran];
    const absl::string_view algorithm = n.fusion.empty() ? n.algo->name : n.fusion;
    NodeReport& report = result->nodes.emplace_back(
        NodeReport{n.id, n.op->name, algorithm, n.output, s, n.cost});
    if (n.fused_into >= 0) report.fused_into = plan.nodes[n.fused_into].id;
    if (metrics != nullptr && !skipped[i] && n.fused_into < 0) {
      metrics->RecordKernel(std::string_view(n.op->name.data(), n.op->name.size()),
                            std::string_view(algorithm.data(), algorithm.size()), s,
                            n.cost.bytes, n.cost.flops);
    }
  }

  // Outputs: returned inline, and kept under their names (all or none).
  auto t_output = Clock::now();
  std::vector<StoredTensorPtr> to_store;
  std::vector<bool> overwrite;
  for (int i = 0; i < num_nodes; ++i) {
    const PlanNode& n = plan.nodes[i];
    if (n.returned) {
      ReturnedTensor& out = result->outputs.emplace_back();
      out.node = n.id;
      out.meta = n.output;
      if (n.host_dest != nullptr) {
        if (absl::Status s = backend.CopyOut(*outputs[i], 0, n.host_dest, n.output.Bytes()); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat("node ", Quote(n.id), "'s output: ", s.message()));
        }
        out.in_place = true;
        continue;
      }
      std::string* data = &out.data;
      data->resize(n.output.Bytes());
      if (staged[i] != nullptr) {
        if (!data->empty()) std::memcpy(data->data(), staged[i], data->size());
      } else {
        RETURN_IF_ERROR(backend.CopyOut(*outputs[i], 0, data->data(), data->size()));
      }
    }
    // Every kernel of the request is done (Finish above): a stored output's memory, once
    // dropped, need not wait behind this lane's later work to go back to the pool.
    if (!n.store_as.empty()) outputs[i]->SetIdle();
    for (const PlanNode::Store& st : n.store_as) {
      to_store.push_back(std::make_shared<StoredTensor>(StoredTensor{st.name, n.output, outputs[i]}));
      overwrite.push_back(st.overwrite);
    }
  }
  if (!to_store.empty()) {
    // The liveness check runs under the store's lock: a request that died after its last node
    // (its deadline passed while the device finished, or the client cancelled) stores nothing.
    RETURN_IF_ERROR(store.InsertAll(to_store, overwrite, plan.tenant, options.check_alive));
    result->stored = std::move(to_store);
  }
  result->output_us = MicrosSince(t_output);
  result->device = backend.device();
  return absl::OkStatus();
}

absl::Status ExecutePlan(const Plan& plan, Backend& backend, ExecEnv& env, TensorStore& store,
                         Metrics* metrics, const ExecuteOptions& options, ExecuteResult* result) {
  LaunchState launch;
  RETURN_IF_ERROR(LaunchPlan(plan, env, metrics, options, &launch, result));
  return CompletePlan(plan, backend, env, store, metrics, options, launch, result);
}

}  // namespace opserve
