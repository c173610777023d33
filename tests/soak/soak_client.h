// One of the soak's concurrent clients: its own connection, its own tensor names, and a model
// of what it stored. It mixes puts, gets, deletes, lists, graphs of every op of the table (inline
// and stored inputs) and malformed requests, and checks every answer: results against the
// table's CPU reference (op_model.h), stored bytes against the model, failures against the code
// their row expects.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/opserve_client.h"
#include "opserve/v1/opserve.grpc.pb.h"
#include "server/engine/backend.h"
#include "tests/soak/malformed.h"
#include "tests/soak/op_model.h"

namespace opserve::soak {

// What the clients saw, merged at the end.
struct SoakStats {
  std::map<std::string, int64_t> rpcs;       // RPCs sent, by method
  std::map<std::string, int64_t> graphs;     // Execute calls checked, by "op/inline|stored"
  std::map<std::string, int64_t> malformed;  // malformed requests answered with their code
  std::vector<double> latency_us;            // every RPC, client-side
  std::vector<double> execute_latency_us;    // well-formed Execute calls
  int64_t results_checked = 0;               // outputs and downloads compared with a model
  int64_t unexpected_errors = 0;             // a failure nothing asked for, or a wrong code
  int64_t wrong_results = 0;
  std::vector<std::string> problems;  // the first few, for the log

  int64_t RequestsSent() const;
  void Merge(const SoakStats& other);
};

class SoakClient {
 public:
  using Clock = std::chrono::steady_clock;

  // `index` makes the names (soak/c<index>/...) and seeds the random choices.
  static absl::StatusOr<std::unique_ptr<SoakClient>> Create(const std::string& target, int index,
                                                            uint64_t seed);

  // Runs the mix until `deadline`, then deletes every tensor it stored and checks that none of
  // its names is left on the server.
  void RunPhase(Clock::time_point deadline);

  const SoakStats& stats() const { return stats_; }

 private:
  struct Stored {
    Expected ref;  // exact for what the client put; a server output keeps its tolerance
  };
  // One input of a graph: its reference, and how the request carries it.
  struct GraphInput {
    Expected ref;
    bool stored = false;
    std::string name;         // the stored name, or the inline key
    client::HostTensor host;  // inline only
  };

  SoakClient(int index, uint64_t seed, std::unique_ptr<client::Client> client,
             std::unique_ptr<v1::OpServe::Stub> stub, std::unique_ptr<ExecEnv> cpu);

  // The actions of the mix.
  void PutNew();
  void PutOverwrite();
  void Get();
  void Delete();
  void List();
  void Graph();
  void Malformed();
  void Cleanup();

  // A fresh or an already stored input `which` of `op`, drawn at random.
  GraphInput DrawInput(const SoakOp& op, int which, const std::vector<int64_t>& shape,
                       v1::DType dtype);
  // A random tensor the ops take, for puts.
  client::HostTensor DrawTensor();
  // Adds a node "second" fed by "first" (refs[0]) to `request`, of an op drawn from those that
  // take first's output, with its expected output in `refs` and its op in `ops`; none where no
  // op does. False, counted as a problem, when its reference fails.
  bool AddSecondNode(v1::ExecuteRequest& request, std::vector<Expected>& refs,
                     std::vector<std::string>& ops);
  std::string NewName(absl::string_view kind);
  std::string RandomStoredName();
  bool PutChecked(const std::string& name, const client::HostTensor& tensor, bool overwrite);

  // Bookkeeping of one RPC: its latency, and whether its status is the one expected.
  void Record(absl::string_view rpc, Clock::time_point start);
  void Sample(std::vector<double>& samples, uint64_t seen, double us);
  bool ExpectOk(absl::string_view what, const absl::Status& status);
  void Problem(bool wrong_result, std::string what);

  const int index_;
  const std::string prefix_;  // soak/c<index>/
  std::mt19937_64 rng_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<v1::OpServe::Stub> stub_;
  std::unique_ptr<ExecEnv> cpu_;  // runs the reference rows, this client's thread only
  std::map<std::string, Stored> stored_;
  uint64_t next_name_ = 0;
  size_t next_malformed_ = 0;
  size_t next_op_ = 0;
  SoakStats stats_;
};

// The per-call deadline of the soak's clients: under load on 2 cores a call may queue, but
// nothing should take this long.
inline constexpr absl::Duration kCallTimeout = absl::Seconds(30);

}  // namespace opserve::soak
