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

// LaunchPlan's stages, in the order it runs them. A stage that fails drains what the request
// queued (env.Finish) before its buffers go back, and names the node where there is one.
class Launcher {
 public:
  Launcher(const Plan& plan, ExecEnv& env, DeviceMetrics* metrics, const ExecuteOptions& options,
           LaunchState& launch, ExecuteResult& result)
      : plan_(plan), env_(env), metrics_(metrics), options_(options), launch_(launch),
        result_(result), num_nodes_(static_cast<int>(plan.nodes.size())),
        inline_buffers_(launch.inline_buffers), outputs_(launch.outputs),
        skipped_(launch.skipped), staged_(launch.staged) {}

  absl::Status Run() {
    env_.BeginRequest(num_nodes_);
    RETURN_IF_ERROR(UploadInlines());
    launch_.compute_start = Clock::now();
    outputs_.assign(num_nodes_, nullptr);
    skipped_.assign(num_nodes_, false);
    // A node fused into another runs nothing (and so fills nothing either).
    for (int i = 0; i < num_nodes_; ++i) {
      skipped_[i] = plan_.nodes[i].fused_into < 0 && HasEmptyInput(plan_.nodes[i]);
    }
    RETURN_IF_ERROR(ReserveStaging());
    ASSIGN_OR_RETURN(const bool as_graph, AllocateForGraph());
    RETURN_IF_ERROR(as_graph ? LaunchAsGraph() : LaunchNodeByNode());
    if (absl::Status s = env_.Launched(); !s.ok()) {
      (void)env_.Finish(num_nodes_);
      return s;
    }
    return absl::OkStatus();
  }

 private:
  // Inputs: upload each inline tensor that a node reads, once.
  absl::Status UploadInlines() {
    auto t_input = Clock::now();
    inline_buffers_.assign(plan_.inlines.size(), nullptr);
    for (const PlanNode& n : plan_.nodes) {
      for (const PlanInput& in : n.inputs) {
        if (in.source != PlanInput::Source::kInline || inline_buffers_[in.index]) continue;
        const PlanInline& pi = plan_.inlines[in.index];
        if (pi.device) {  // already on the device: read in place
          inline_buffers_[in.index] = pi.device;
          continue;
        }
        auto buffer = env_.AllocateTransient(pi.meta.Bytes());
        if (!buffer.ok()) {
          (void)env_.Finish(0);  // the copies already queued finish before their buffers go back
          return absl::Status(buffer.status().code(),
                              absl::StrCat("inline tensor ", Quote(pi.name), ": ",
                                           buffer.status().message()));
        }
        if (absl::Status s = env_.CopyIn(**buffer, pi.data.data(), pi.data.size()); !s.ok()) {
          (void)env_.Finish(0);
          return absl::Status(s.code(),
                              absl::StrCat("inline tensor ", Quote(pi.name), ": ", s.message()));
        }
        inline_buffers_[in.index] = *std::move(buffer);
      }
    }
    result_.input_us = MicrosSince(t_input);
    return absl::OkStatus();
  }

  // Returned outputs go to host memory in stream order, so the request's one wait covers them.
  // Their places are reserved first: in a graph the copies are nodes too, and the places among
  // its bindings. An output with a host destination is copied there after the wait
  // (CompletePlan), as is one the staging area cannot hold.
  absl::Status ReserveStaging() {
    staged_.assign(num_nodes_, nullptr);
    for (int i = 0; i < num_nodes_; ++i) {
      if (!plan_.nodes[i].returned || plan_.nodes[i].host_dest != nullptr) continue;
      auto p = env_.ReserveStaging(plan_.nodes[i].output.Bytes());
      if (!p.ok()) {
        (void)env_.Finish(0);
        return p.status();
      }
      staged_[i] = *p;
    }
    return absl::OkStatus();
  }

  // Whether the request runs as one CUDA graph: where the device has a graph cache, with every
  // output allocated first (allocations are not captured, and the graph's intermediates live
  // until the request ends). When they do not fit the budget together, false: the request runs
  // node by node instead, where each intermediate goes back after its last reader.
  // A single node too: besides its kernel it has timing marks and the copy of its output, and
  // one graph launch queues them all for less host time than those calls take one by one.
  absl::StatusOr<bool> AllocateForGraph() {
    if (!env_.LaunchesGraphs()) return false;
#if OPSERVE_TEST_HOOKS
    // A fault injected into every node must reach the device: a replayed graph would skip it.
    if (options_.fail_algorithm == "*") return false;
#endif
    // A graph replays its waits as they were captured: an input still arriving waits on events
    // of this request's own.
    for (const PlanNode& n : plan_.nodes) {
      for (const PlanInput& in : n.inputs) {
        if (in.source == PlanInput::Source::kStored && in.stored->arrival) return false;
      }
    }
    for (int i = 0; i < num_nodes_; ++i) {
      if (plan_.nodes[i].fused_into >= 0) continue;  // no output of its own
      if (plan_.nodes[i].device_dest) {
        outputs_[i] = plan_.nodes[i].device_dest;
        continue;
      }
      auto out = Allocate(env_, plan_.nodes[i]);
      if (!out.ok()) {
        outputs_.assign(num_nodes_, nullptr);  // unused: back in stream order at once
        if (out.status().code() == absl::StatusCode::kResourceExhausted) return false;
        (void)env_.Finish(0);
        return At(i, out.status());
      }
      outputs_[i] = *std::move(out);
    }
    return true;
  }

  absl::Status LaunchAsGraph() {
    if (options_.check_alive) {
      if (auto s = options_.check_alive(); !s.ok()) {
        (void)env_.Finish(0);
        return s;
      }
    }
    std::vector<const void*> bindings;
    for (int i = 0; i < num_nodes_; ++i) {
      for (const PlanInput& in : plan_.nodes[i].inputs) {
        if (in.source == PlanInput::Source::kStored) bindings.push_back(in.stored->buffer->data());
        if (in.source == PlanInput::Source::kInline) {
          bindings.push_back(inline_buffers_[in.index]->data());
        }
      }
      if (outputs_[i]) bindings.push_back(outputs_[i]->data());
      if (staged_[i]) bindings.push_back(staged_[i]);
    }
    int failed = -1;
    auto replay = env_.LaunchAsGraph(plan_.signature, bindings, [&]() -> absl::Status {
      for (int i = 0; i < num_nodes_; ++i) {
        if (absl::Status s = LaunchNode(i); !s.ok()) {
          failed = i;
          return s;
        }
      }
      return StageOutputs();
    });
    if (!replay.ok()) {
      (void)env_.Finish(num_nodes_);  // drain the device before buffers go back
      return failed >= 0 ? At(failed, replay.status()) : replay.status();
    }
    result_.replay = *replay;
    if (metrics_ != nullptr) {
      metrics_->RecordGraph(*replay == GraphReplay::kReplayed   ? "hit"
                            : *replay == GraphReplay::kRebound  ? "rebound"
                            : *replay == GraphReplay::kCaptured ? "miss"
                                                                 : "direct");
    }
    return absl::OkStatus();
  }

  // Node by node; an intermediate's buffer goes back after its last reader.
  absl::Status LaunchNodeByNode() {
    if (metrics_ != nullptr && env_.LaunchesGraphs()) metrics_->RecordGraph("direct");
    for (int i = 0; i < num_nodes_; ++i) {
      const PlanNode& n = plan_.nodes[i];
      // Keep at most the running node and this one on the device: a request abandoned below
      // (deadline, cancellation) then waits for no more than that before its buffers go back.
      if (i >= 2) {
        if (auto s = env_.WaitNode(i - 2); !s.ok()) {
          (void)env_.Finish(i);
          return At(i, s);
        }
      }
      if (options_.check_alive) {
        if (auto s = options_.check_alive(); !s.ok()) {
          (void)env_.Finish(i);  // drain the device before buffers go back
          return At(i, s);
        }
      }
      if (n.fused_into >= 0) {
        if (absl::Status s = LaunchNode(i); !s.ok()) {
          (void)env_.Finish(i + 1);
          return At(i, s);
        }
        continue;
      }
      auto out = n.device_dest ? absl::StatusOr<BufferPtr>(n.device_dest) : Allocate(env_, n);
      if (!out.ok()) {
        // Drain first: the nodes already queued read stored tensors this request holds, and a
        // tensor deleted meanwhile goes back to the pool when the request lets go of it.
        (void)env_.Finish(i);
        return At(i, out.status());
      }
      outputs_[i] = *std::move(out);
      if (absl::Status s = LaunchNode(i); !s.ok()) {
        (void)env_.Finish(i + 1);  // drain the device before buffers go back
        return At(i, s);
      }
      for (const PlanInput& in : n.inputs) {
        if (in.source != PlanInput::Source::kNode) continue;
        const PlanNode& src = plan_.nodes[in.index];
        if (src.last_use == i && !src.returned && src.store_as.empty()) outputs_[in.index].reset();
      }
    }
    // A request abandoned during its last node stages and stores nothing.
    if (options_.check_alive) {
      if (auto s = options_.check_alive(); !s.ok()) {
        (void)env_.Finish(num_nodes_);
        return s;
      }
    }
    if (absl::Status s = StageOutputs(); !s.ok()) {
      (void)env_.Finish(num_nodes_);
      return s;
    }
    return absl::OkStatus();
  }

  // Queues node i between its timing marks, on the buffers allocated for it.
  absl::Status LaunchNode(int i) {
    const PlanNode& n = plan_.nodes[i];
    if (n.fused_into >= 0) {  // its work is in the fused node's kernel; marked for the timing
      env_.MarkStart(i);
      env_.MarkEnd(i);
      return absl::OkStatus();
    }
    ptrs_.clear();
    for (const PlanInput& in : n.inputs) {
      switch (in.source) {
        case PlanInput::Source::kStored: ptrs_.push_back(in.stored->buffer->data()); break;
        case PlanInput::Source::kInline: ptrs_.push_back(inline_buffers_[in.index]->data()); break;
        case PlanInput::Source::kNode: ptrs_.push_back(outputs_[in.index]->data()); break;
      }
    }
    // Every node is marked, a skipped one too: Finish and WaitNode read each node's marks.
    absl::Status s;
    env_.MarkStart(i);
    if (skipped_[i]) {
      // No kernel runs on zero elements: the output (zeros, or NaNs for a mean) is filled, and the
      // node reports the algorithm that would have run with a kernel time of 0.
      s = env_.Fill(*outputs_[i], n.op->empty_fill == EmptyFill::kNaN ? 0xFF : 0, n.output.Bytes());
    } else {
      s = AwaitArrivals(n);
      KernelArgs args{ptrs_, n.input_meta, outputs_[i]->data(), n.output, n.attrs, env_};
      if (s.ok()) s = n.algo->run(args);
      env_.set_arriving({});
#if OPSERVE_TEST_HOOKS
      if (!options_.fail_algorithm.empty() &&
          (options_.fail_algorithm == "*" ||
           options_.fail_algorithm ==
               absl::StrCat(std::string(n.op->name), "/", std::string(n.algo->name)))) {
        s = env_.InjectFault();
      }
#endif
    }
    env_.MarkEnd(i);
    return s;
  }

  // Inputs still being copied in from another device: a row that reads them chunk by chunk gets
  // them through KernelEnv::arriving; for any other the stream waits for all of each first.
  absl::Status AwaitArrivals(const PlanNode& n) {
    std::vector<const InputArrival*> arriving;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const PlanInput& in = n.inputs[j];
      if (in.source != PlanInput::Source::kStored || !in.stored->arrival) continue;
      const InputArrival& a = *in.stored->arrival;
      if (n.algo->reads_arriving) {
        arriving.resize(n.inputs.size(), nullptr);
        arriving[j] = &a;
      } else if (!a.events.empty()) {
        RETURN_IF_ERROR(env_.AwaitArrival(a, a.events.size() - 1));
      }
    }
    env_.set_arriving(std::move(arriving));
    return absl::OkStatus();
  }

  // Queues the copies of the returned outputs into their reserved places.
  absl::Status StageOutputs() {
    for (int i = 0; i < num_nodes_; ++i) {
      if (staged_[i] == nullptr) continue;
      RETURN_IF_ERROR(env_.CopyToStaging(*outputs_[i], staged_[i], plan_.nodes[i].output.Bytes()));
    }
    return absl::OkStatus();
  }

  absl::Status At(int i, const absl::Status& s) const {
    const PlanNode& n = plan_.nodes[i];
    return absl::Status(s.code(), absl::StrCat("node '", n.id, "' (", std::string(n.op->name), "/",
                                               std::string(n.algo->name), "): ", s.message()));
  }

  const Plan& plan_;
  ExecEnv& env_;
  DeviceMetrics* const metrics_;
  const ExecuteOptions& options_;
  LaunchState& launch_;
  ExecuteResult& result_;
  const int num_nodes_;
  std::vector<BufferPtr>& inline_buffers_;
  std::vector<BufferPtr>& outputs_;
  std::vector<bool>& skipped_;
  std::vector<void*>& staged_;
  std::vector<const void*> ptrs_;  // LaunchNode's kernel inputs, kept to reuse its memory
};

}  // namespace

absl::Status LaunchPlan(const Plan& plan, ExecEnv& env, DeviceMetrics* metrics,
                        const ExecuteOptions& options, LaunchState* launch,
                        ExecuteResult* result) {
  return Launcher(plan, env, metrics, options, *launch, *result).Run();
}

absl::Status CompletePlan(const Plan& plan, Backend& backend, ExecEnv& env, TensorStore& store,
                          DeviceMetrics* metrics, const ExecuteOptions& options, LaunchState& launch,
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
      to_store.push_back(std::make_shared<StoredTensor>(StoredTensor{st.name, n.output, outputs[i], plan.device}));
      overwrite.push_back(st.overwrite);
    }
  }
  if (!to_store.empty() && !plan.commit) {
    result->stored = std::move(to_store);
  } else if (!to_store.empty()) {
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
                         DeviceMetrics* metrics, const ExecuteOptions& options, ExecuteResult* result) {
  LaunchState launch;
  RETURN_IF_ERROR(LaunchPlan(plan, env, metrics, options, &launch, result));
  return CompletePlan(plan, backend, env, store, metrics, options, launch, result);
}

}  // namespace opserve
