#include "server/rpc/model_stats.h"

#include <algorithm>
#include <cmath>

namespace opserve {
namespace {

uint64_t MillisSinceEpoch(ModelStats::SystemClock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  return static_cast<uint64_t>(std::max<int64_t>(0, ms.count()));
}

}  // namespace

void ModelStats::Duration::Add(double us) {
  ++count;
  ns += static_cast<uint64_t>(std::llround(std::max(0.0, us) * 1e3));
}

void ModelStats::PruneIfGrown() {
  if (records_.size() < prune_at_) return;
  absl::erase_if(records_, [](const auto& entry) {
    return entry.second.of_graph && entry.second.graph.expired();
  });
  prune_at_ = std::max<size_t>(1024, 2 * records_.size());
}

ModelStats::Record& ModelStats::Find(const StatsModel& model) {
  PruneIfGrown();
  Record& r = records_[KeyOf(model)];
  if (model.graph != nullptr && r.graph.lock() != model.graph) {
    r = Record{};
    r.graph = model.graph;
    r.of_graph = true;
  }
  return r;
}

void ModelStats::RecordSuccess(const StatsModel& model, const RequestTimes& t,
                               SystemClock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Record& r = Find(model);
  r.success.Add(t.total_us);
  r.queue.Add(t.queue_us);
  r.input.Add(t.input_us);
  r.infer.Add(t.compute_us);
  r.output.Add(t.output_us);
  ++r.inference_count;
  r.executions += 1.0 / std::max(1, t.batch_size);
  r.last_inference_ms = std::max(r.last_inference_ms, MillisSinceEpoch(now));
}

// As Triton does, a failure counts its duration and moves last_inference, not its run's parts:
// it may have failed before it had any.
void ModelStats::RecordFailure(const StatsModel& model, double total_us,
                               SystemClock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Record& r = Find(model);
  r.fail.Add(total_us);
  r.last_inference_ms = std::max(r.last_inference_ms, MillisSinceEpoch(now));
}

void ModelStats::Fill(const StatsModel& model, inference::ModelStatistics* out) const {
  out->set_name(model.name);
  out->set_version("1");
  std::lock_guard<std::mutex> lock(mu_);
  // A model with no request yet reads as a record of zeros: Triton's clients read every
  // duration of inference_stats, which Triton fills for such a model too.
  static const Record kNone;
  auto it = records_.find(KeyOf(model));
  const Record* found = it == records_.end() ? &kNone : &it->second;
  // A record of another graph, saved under the name before this one, is not this one's.
  if (model.graph != nullptr && found->graph.lock() != model.graph) found = &kNone;
  const Record& r = *found;
  out->set_last_inference(r.last_inference_ms);
  out->set_inference_count(r.inference_count);
  out->set_execution_count(static_cast<uint64_t>(std::llround(r.executions)));
  inference::InferStatistics* s = out->mutable_inference_stats();
  auto put = [](const Duration& d, inference::StatisticDuration* to) {
    to->set_count(d.count);
    to->set_ns(d.ns);
  };
  put(r.success, s->mutable_success());
  put(r.fail, s->mutable_fail());
  put(r.queue, s->mutable_queue());
  put(r.input, s->mutable_compute_input());
  put(r.infer, s->mutable_compute_infer());
  put(r.output, s->mutable_compute_output());
}

}  // namespace opserve
