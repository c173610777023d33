// The Open Inference Protocol's ModelStatistics, as Triton keeps them: per model, the requests
// that succeeded and failed with their durations, the successful ones' time split into queue,
// input, compute and output, the inference and execution counts and the last request's time.
// ModelInfer records each request where it completes (infer_call.cc), from the request's own
// times; nothing else does (Execute is opserve.v1's, and not a model's).
//
// Op models are the server's: one record each, over every tenant, as Triton has no tenants. A
// saved graph is its tenant's: its record is keyed by tenant and name, and belongs to the graph
// that was saved under that name, so a graph saved again over it starts from zero.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "inference/grpc_service.pb.h"
#include "server/rpc/graph_store.h"

namespace opserve {

// Which model a request ran: an op model (graph nullptr, tenant ignored) or a saved graph.
struct StatsModel {
  std::string tenant;
  std::string name;
  SavedGraphPtr graph;  // nullptr: an op model
};

// One finished request's times, in microseconds as the engine measures them.
struct RequestTimes {
  double total_us = 0;  // receipt to answer at the edge
  double queue_us = 0;  // receipt to a lane taking it (successful requests only)
  double input_us = 0, compute_us = 0, output_us = 0;  // its run's (shared by a batch)
  int batch_size = 1;  // requests that ran as one plan with it
};

class ModelStats {
 public:
  using SystemClock = std::chrono::system_clock;

  void RecordSuccess(const StatsModel& model, const RequestTimes& times,
                     SystemClock::time_point now = SystemClock::now());
  void RecordFailure(const StatsModel& model, double total_us,
                     SystemClock::time_point now = SystemClock::now());

  // `model`'s statistics so far, version "1": every duration of inference_stats, zero for a
  // model with no request yet.
  void Fill(const StatsModel& model, inference::ModelStatistics* out) const;

 private:
  struct Duration {
    uint64_t count = 0;
    uint64_t ns = 0;
    void Add(double us);
  };
  struct Record {
    std::weak_ptr<const SavedGraph> graph;  // the saved graph counted
    bool of_graph = false;                  // false: an op model's
    Duration success, fail, queue, input, infer, output;
    uint64_t last_inference_ms = 0;
    uint64_t inference_count = 0;
    // Each member of a batch of n adds 1/n, so a run of n requests counts once, as Triton's
    // execution_count does; rounded when read.
    double executions = 0;
  };
  using Key = std::pair<std::string, std::string>;  // (tenant, name); tenant "" for op models

  static Key KeyOf(const StatsModel& model) {
    return {model.graph == nullptr ? std::string() : model.tenant, model.name};
  }
  // The record of `model`, reset when it belonged to a graph that was replaced or deleted.
  Record& Find(const StatsModel& model);
  // Drops the records of graphs that no longer exist, once the records have doubled since the
  // last time: a tenant that saves and deletes graph after graph under new names would
  // otherwise grow them without end.
  void PruneIfGrown();

  mutable std::mutex mu_;
  absl::flat_hash_map<Key, Record> records_;
  size_t prune_at_ = 1024;
};

}  // namespace opserve
