#include "tests/soak/soak_client.h"

#include <algorithm>
#include <optional>
#include <set>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace opserve::soak {
namespace {

// Tensors one client keeps stored at once, beside its anchor: the store stays small, so the
// server's memory after warm-up reflects leaks rather than what the clients hold.
constexpr size_t kMaxStored = 6;
// Bounds on one phase of one client, whatever its deadline says.
constexpr int64_t kMaxActionsPerPhase = 10'000'000;
// Latency samples one client keeps (reservoir sampling past that): exact percentiles for a CI
// run, bounded memory for a long one by hand.
constexpr size_t kMaxLatencySamples = 50'000;
constexpr size_t kMaxProblemsPerClient = 8;
// Connections are per client: gRPC would otherwise share one subchannel among equal channels.
constexpr char kLocalSubchannelPool[] = "grpc.use_local_subchannel_pool";

// Whether `op` takes `t` as its only input on the CPU backend.
bool TakesAlone(const SoakOp& op, const Expected& t) {
  const std::vector<TensorMeta> metas = {t.Meta()};
  return op.spec->arity == 1 && op.Runs(t.tensor.dtype) && op.spec->infer(metas).ok();
}

bool Chance(std::mt19937_64& rng, int percent) { return static_cast<int>(rng() % 100) < percent; }

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

}  // namespace

int64_t SoakStats::RequestsSent() const {
  int64_t n = 0;
  for (const auto& [rpc, count] : rpcs) n += count;
  return n;
}

void SoakStats::Merge(const SoakStats& o) {
  for (const auto& [k, v] : o.rpcs) rpcs[k] += v;
  for (const auto& [k, v] : o.graphs) graphs[k] += v;
  for (const auto& [k, v] : o.malformed) malformed[k] += v;
  latency_us.insert(latency_us.end(), o.latency_us.begin(), o.latency_us.end());
  execute_latency_us.insert(execute_latency_us.end(), o.execute_latency_us.begin(),
                            o.execute_latency_us.end());
  results_checked += o.results_checked;
  unexpected_errors += o.unexpected_errors;
  wrong_results += o.wrong_results;
  problems.insert(problems.end(), o.problems.begin(), o.problems.end());
}

absl::StatusOr<std::unique_ptr<SoakClient>> SoakClient::Create(const std::string& target, int index,
                                                               uint64_t seed) {
  client::ClientOptions options;
  options.target = target;
  options.timeout = kCallTimeout;
  // 64 clients connecting at once on 2 busy cores: a refused or slow connect is retried by the
  // channel; without this a call made while it reconnects fails at once with UNAVAILABLE.
  options.wait_for_ready = true;
  // Half the clients move tensors in 4 KiB chunks, so puts and gets of a few KiB span several
  // messages; the server's smallest GetTensor chunk is 4 KiB too.
  if (index % 2 == 1) options.chunk_bytes = 4096;
  options.channel_args[kLocalSubchannelPool] = 1;
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(options);
  if (!c.ok()) return c.status();
  grpc::ChannelArguments args;
  args.SetInt(kLocalSubchannelPool, 1);
  auto stub = v1::OpServe::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  absl::StatusOr<std::unique_ptr<ExecEnv>> cpu = CpuDevice().NewExecEnv();
  if (!cpu.ok()) return cpu.status();
  return std::unique_ptr<SoakClient>(
      new SoakClient(index, seed, *std::move(c), std::move(stub), *std::move(cpu)));
}

SoakClient::SoakClient(int index, uint64_t seed, std::unique_ptr<client::Client> client,
                       std::unique_ptr<v1::OpServe::Stub> stub, std::unique_ptr<ExecEnv> cpu)
    : index_(index),
      prefix_(absl::StrCat("soak/c", index, "/")),
      rng_(seed * 1000003 + static_cast<uint64_t>(index)),
      client_(std::move(client)),
      stub_(std::move(stub)),
      cpu_(std::move(cpu)),
      next_malformed_(static_cast<size_t>(index)),
      next_op_(static_cast<size_t>(index)) {}

// ---- bookkeeping ----

// Keeps every sample up to kMaxLatencySamples, then a uniform reservoir of all `seen`.
void SoakClient::Sample(std::vector<double>& samples, uint64_t seen, double us) {
  if (samples.size() < kMaxLatencySamples) {
    samples.push_back(us);
  } else if (const uint64_t slot = rng_() % seen; slot < kMaxLatencySamples) {
    samples[slot] = us;
  }
}

void SoakClient::Record(absl::string_view rpc, Clock::time_point start) {
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  const int64_t calls = ++stats_.rpcs[std::string(rpc)];
  Sample(stats_.latency_us, static_cast<uint64_t>(stats_.RequestsSent()), us);
  if (rpc == "Execute") Sample(stats_.execute_latency_us, static_cast<uint64_t>(calls), us);
}

void SoakClient::Problem(bool wrong_result, std::string what) {
  (wrong_result ? stats_.wrong_results : stats_.unexpected_errors)++;
  if (stats_.problems.size() < kMaxProblemsPerClient) {
    stats_.problems.push_back(absl::StrCat("client ", index_, ": ", what));
  }
}

bool SoakClient::ExpectOk(absl::string_view what, const absl::Status& status) {
  if (status.ok()) return true;
  Problem(/*wrong_result=*/false, absl::StrCat(what, ": ", StatusText(status)));
  return false;
}

std::string SoakClient::NewName(absl::string_view kind) {
  return absl::StrCat(prefix_, kind, next_name_++);
}

std::string SoakClient::RandomStoredName() {
  auto it = stored_.begin();
  std::advance(it, static_cast<long>(rng_() % stored_.size()));
  return it->first;
}

bool SoakClient::PutChecked(const std::string& name, const client::HostTensor& tensor,
                            bool overwrite) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<v1::TensorInfo> info = client_->PutTensor(name, tensor, overwrite);
  Record("PutTensor", start);
  if (!ExpectOk(absl::StrCat("PutTensor ", name), info.status())) return false;
  if (info->name() != name || info->dtype() != tensor.dtype ||
      std::vector<int64_t>(info->shape().begin(), info->shape().end()) != tensor.shape ||
      info->bytes() != tensor.data.size()) {
    Problem(/*wrong_result=*/true,
            absl::StrCat("PutTensor ", name, " answered ", info->ShortDebugString()));
    return false;
  }
  stored_[name] = Stored{Exactly(tensor)};
  return true;
}

// ---- the mix ----

void SoakClient::RunPhase(Clock::time_point deadline) {
  const std::string anchor = absl::StrCat(prefix_, "anchor");
  const float anchor_values[4] = {1, 2, 3, 4};
  Clock::time_point start = Clock::now();
  absl::Status put = client_
                         ->PutTensor(anchor, v1::FLOAT32, {4}, anchor_values, sizeof anchor_values,
                                     /*overwrite=*/true)
                         .status();
  Record("PutTensor", start);
  ExpectOk("PutTensor anchor", put);

  for (int64_t i = 0; i < kMaxActionsPerPhase && Clock::now() < deadline; ++i) {
    const int roll = static_cast<int>(rng_() % 100);
    if (roll < 35) {
      Graph();
    } else if (roll < 45) {
      if (stored_.size() < kMaxStored) {
        PutNew();
      } else {
        Delete();
      }
    } else if (roll < 50) {
      PutOverwrite();
    } else if (roll < 62) {
      Get();
    } else if (roll < 70) {
      Delete();
    } else if (roll < 73) {
      List();
    } else {
      Malformed();
    }
  }
  Cleanup();
}

client::HostTensor SoakClient::DrawTensor() {
  const std::span<const SoakOp> ops = SoakOps();
  const SoakOp& op = ops[rng_() % ops.size()];
  const v1::DType dtype = op.dtypes[rng_() % op.dtypes.size()];
  const std::optional<Shapes> shapes = DrawShapes(*op.spec, dtype, nullptr, rng_);
  return RandomTensor(dtype, shapes ? (*shapes)[0] : std::vector<int64_t>{}, rng_);
}

void SoakClient::PutNew() { PutChecked(NewName("t"), DrawTensor(), /*overwrite=*/false); }

void SoakClient::PutOverwrite() {
  if (stored_.empty()) return PutNew();
  PutChecked(RandomStoredName(), DrawTensor(), /*overwrite=*/true);
}

void SoakClient::Get() {
  if (stored_.empty()) return PutNew();
  const std::string name = RandomStoredName();
  const Clock::time_point start = Clock::now();
  absl::StatusOr<client::HostTensor> got = client_->GetTensor(name);
  Record("GetTensor", start);
  if (!ExpectOk(absl::StrCat("GetTensor ", name), got.status())) return;
  ++stats_.results_checked;
  Stored& s = stored_[name];
  if (absl::Status same = Compare(s.ref, *got); !same.ok()) {
    Problem(/*wrong_result=*/true, absl::StrCat("GetTensor ", name, ": ", same.message()));
    return;
  }
  // A server output within tolerance: from now on its exact bytes are known.
  if (!s.ref.Exact()) s.ref = Exactly(*std::move(got));
}

void SoakClient::Delete() {
  if (stored_.empty()) return PutNew();
  const std::string name = RandomStoredName();
  const Clock::time_point start = Clock::now();
  absl::StatusOr<v1::TensorInfo> info = client_->DeleteTensor(name);
  Record("DeleteTensor", start);
  const Expected ref = std::move(stored_[name].ref);
  stored_.erase(name);
  if (!ExpectOk(absl::StrCat("DeleteTensor ", name), info.status())) return;
  if (info->name() != name || info->dtype() != ref.tensor.dtype || info->bytes() != ref.Bytes()) {
    Problem(/*wrong_result=*/true,
            absl::StrCat("DeleteTensor ", name, " answered ", info->ShortDebugString()));
  }
}

void SoakClient::List() {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client_->ListTensors();
  Record("ListTensors", start);
  if (!ExpectOk("ListTensors", list.status())) return;
  ++stats_.results_checked;
  std::set<std::string> mine;
  for (const v1::TensorInfo& info : *list) {
    if (!absl::StartsWith(info.name(), prefix_)) continue;
    mine.insert(info.name());
    const auto it = stored_.find(info.name());
    if (info.name() == prefix_ + "anchor") continue;
    if (it == stored_.end()) {
      // A name of a failed request (under bad/) or one this client deleted.
      Problem(/*wrong_result=*/true,
              absl::StrCat("ListTensors shows ", info.name(), ", which should not be stored"));
    } else if (info.bytes() != it->second.ref.Bytes() ||
               info.dtype() != it->second.ref.tensor.dtype) {
      Problem(/*wrong_result=*/true,
              absl::StrCat("ListTensors: ", info.ShortDebugString(), " differs from the model"));
    }
  }
  for (const auto& [name, s] : stored_) {
    if (!mine.count(name)) {
      Problem(/*wrong_result=*/true, absl::StrCat("ListTensors lacks ", name));
    }
  }
}

SoakClient::GraphInput SoakClient::DrawInput(const SoakOp& op, int which,
                                             const std::vector<int64_t>& shape, v1::DType dtype) {
  GraphInput in;
  in.stored = Chance(rng_, 50);
  // Reuse a stored tensor the op accepts, when there is one, for input 0 of one-input ops.
  if (in.stored && which == 0 && op.spec->arity == 1 && Chance(rng_, 50)) {
    for (const auto& [name, s] : stored_) {
      if (s.ref.Exact() && TakesAlone(op, s.ref)) {
        in.name = name;
        in.ref = s.ref;
        return in;
      }
    }
  }
  in.host = RandomTensor(dtype, shape, rng_);
  in.ref = Exactly(in.host);
  if (!in.stored) {
    in.name = absl::StrCat("x", which);
    return in;
  }
  in.name = NewName("in");
  if (!PutChecked(in.name, in.host, /*overwrite=*/false)) in.name.clear();
  return in;
}

bool SoakClient::AddSecondNode(v1::ExecuteRequest& request, std::vector<Expected>& refs,
                               std::vector<std::string>& ops) {
  // Every op that takes the first node's output as its input 0, with inputs shaped to fit.
  struct Next {
    const SoakOp* op;
    Shapes shapes;
  };
  std::vector<Next> next;
  const client::HostTensor& fed = refs[0].tensor;
  for (const SoakOp& op : SoakOps()) {
    if (!op.Runs(fed.dtype)) continue;
    if (std::optional<Shapes> shapes = DrawShapes(*op.spec, fed.dtype, &fed.shape, rng_)) {
      next.push_back({&op, *std::move(shapes)});
    }
  }
  if (next.empty()) return true;
  const Next& n = next[rng_() % next.size()];
  v1::Node* second = request.add_nodes();
  second->set_id("second");
  second->set_op(std::string(n.op->spec->name));
  second->add_inputs()->set_node("first");
  // Its other inputs travel inline.
  std::vector<Expected> others;
  for (size_t i = 1; i < n.shapes.size(); ++i) {
    client::HostTensor host = RandomTensor(fed.dtype, n.shapes[i], rng_);
    const std::string key = absl::StrCat("b", i + 1);
    second->add_inputs()->set_inline_name(key);
    (*request.mutable_inline_tensors())[key] = client::ToProto(host);
    others.push_back(Exactly(std::move(host)));
  }
  // From the first node's reference output: on the CPU backend the server runs the same
  // reference rows, so that is the input its second node sees too.
  std::vector<const Expected*> inputs = {&refs[0]};
  for (const Expected& e : others) inputs.push_back(&e);
  absl::StatusOr<Expected> ref = Reference(*n.op->spec, inputs, *cpu_);
  if (!ref.ok()) {
    Problem(/*wrong_result=*/true, absl::StrCat("reference: ", ref.status().message()));
    return false;
  }
  refs.push_back(*std::move(ref));
  ops.push_back(std::string(n.op->spec->name));
  return true;
}

void SoakClient::Graph() {
  const std::span<const SoakOp> all = SoakOps();
  const SoakOp& op = all[next_op_++ % all.size()];
  // Room for every input to be uploaded, made before any input is chosen so that no input can
  // be deleted while in use.
  while (stored_.size() + static_cast<size_t>(op.spec->arity) > kMaxStored) Delete();
  const v1::DType dtype = op.dtypes[rng_() % op.dtypes.size()];
  const std::optional<Shapes> shapes = DrawShapes(*op.spec, dtype, nullptr, rng_);
  if (!shapes) {
    Problem(/*wrong_result=*/false, absl::StrCat(op.spec->name, ": no small_shapes case fits"));
    return;
  }

  std::vector<GraphInput> inputs;
  for (int i = 0; i < op.spec->arity; ++i) {
    inputs.push_back(DrawInput(op, i, (*shapes)[i], dtype));
  }
  for (const GraphInput& in : inputs) {
    if (in.name.empty()) return;  // its upload failed, already counted
  }

  // The first node, and sometimes a second fed by it.
  v1::ExecuteRequest request;
  std::vector<std::string> ops = {std::string(op.spec->name)};
  v1::Node* first = request.add_nodes();
  first->set_id("first");
  first->set_op(ops[0]);
  std::vector<const Expected*> first_inputs;
  for (const GraphInput& in : inputs) {
    if (in.stored) {
      first->add_inputs()->set_stored(in.name);
    } else {
      first->add_inputs()->set_inline_name(in.name);
      (*request.mutable_inline_tensors())[in.name] = client::ToProto(in.host);
    }
    first_inputs.push_back(&in.ref);
  }
  absl::StatusOr<Expected> first_ref = Reference(*op.spec, first_inputs, *cpu_);
  if (!first_ref.ok()) {
    Problem(/*wrong_result=*/true, absl::StrCat("reference: ", first_ref.status().message()));
    return;
  }
  std::vector<Expected> refs = {*std::move(first_ref)};
  if (Chance(rng_, 25) && !AddSecondNode(request, refs, ops)) return;
  const std::string last = refs.size() == 1 ? "first" : "second";
  v1::OutputSpec* out = request.add_outputs();
  out->set_node(last);
  out->set_return_inline(true);
  if (refs.size() == 2 && Chance(rng_, 50)) {
    v1::OutputSpec* also = request.add_outputs();
    also->set_node("first");
    also->set_return_inline(true);
  }
  std::string store_as;
  if (Chance(rng_, 20)) {
    const bool replace = stored_.size() >= kMaxStored;
    store_as = replace ? RandomStoredName() : NewName("out");
    v1::OutputSpec* keep = request.add_outputs();
    keep->set_node(last);
    keep->set_store_as(store_as);
    keep->set_overwrite(replace);
  }

  const Clock::time_point start = Clock::now();
  absl::StatusOr<v1::ExecuteResponse> response = client_->Execute(request);
  Record("Execute", start);
  const client::HostTensor& input0 = inputs[0].ref.tensor;
  const std::string what = absl::StrCat(
      "Execute ", absl::StrJoin(ops, "->"), " ", client::DTypeName(input0.dtype),
      client::ShapeString(input0.shape), inputs[0].stored ? " stored" : " inline");
  if (!ExpectOk(what, response.status())) {
    if (!store_as.empty()) stored_.erase(store_as);  // an overwrite may or may not have landed
    return;
  }
  ++stats_.graphs[absl::StrCat(op.spec->name, inputs[0].stored ? "/stored" : "/inline")];
  if (response->nodes_size() != static_cast<int>(refs.size())) {
    Problem(/*wrong_result=*/true,
            absl::StrCat(what, ": ", response->nodes_size(), " node results"));
  }
  // Each output is held to the tolerance of the algorithm that computed it.
  for (const v1::NodeResult& node : response->nodes()) {
    (node.id() == "first" ? refs[0] : refs.back()).algorithm = node.algorithm();
  }
  int returned = 0;
  for (const v1::NamedTensor& named : response->outputs()) {
    const Expected& ref = named.node() == "first" ? refs[0] : refs.back();
    absl::StatusOr<client::HostTensor> got = client::FromProto(named.tensor());
    ++stats_.results_checked;
    ++returned;
    absl::Status same = got.ok() ? Compare(ref, *got) : got.status();
    if (!same.ok()) {
      Problem(/*wrong_result=*/true,
              absl::StrCat(what, ": output ", named.node(), ": ", same.message()));
    }
  }
  if (returned != request.outputs_size() - (store_as.empty() ? 0 : 1)) {
    Problem(/*wrong_result=*/true, absl::StrCat(what, ": ", returned, " outputs returned"));
  }
  if (!store_as.empty()) {
    const bool listed = response->stored_size() == 1 && response->stored(0).name() == store_as &&
                        response->stored(0).bytes() == refs.back().Bytes();
    if (!listed) {
      Problem(/*wrong_result=*/true, absl::StrCat(what, ": stored ", response->ShortDebugString()));
    }
    stored_[store_as] = Stored{refs.back()};
  }
}

void SoakClient::Malformed() {
  const std::span<const MalformedKind> kinds = MalformedKinds();
  const MalformedKind& kind = kinds[next_malformed_++ % kinds.size()];
  MalformedContext ctx{*client_, *stub_, prefix_ + "bad/", prefix_ + "anchor", kCallTimeout};
  const Clock::time_point start = Clock::now();
  const absl::Status status = kind.send(ctx);
  Record("Malformed", start);
  if (status.code() == kind.expected) {
    ++stats_.malformed[kind.name];
    return;
  }
  Problem(/*wrong_result=*/false,
          absl::StrCat("malformed ", kind.name, ": expected ",
                       absl::StatusCodeToString(kind.expected), ", got ", StatusText(status)));
}

void SoakClient::Cleanup() {
  while (!stored_.empty()) Delete();
  Clock::time_point start = Clock::now();
  absl::Status deleted = client_->DeleteTensor(prefix_ + "anchor").status();
  Record("DeleteTensor", start);
  ExpectOk("DeleteTensor anchor", deleted);
  start = Clock::now();
  absl::StatusOr<std::vector<v1::TensorInfo>> list = client_->ListTensors();
  Record("ListTensors", start);
  if (!ExpectOk("ListTensors after cleanup", list.status())) return;
  for (const v1::TensorInfo& info : *list) {
    if (absl::StartsWith(info.name(), prefix_)) {
      Problem(/*wrong_result=*/true,
              absl::StrCat("after cleanup the server still holds ", info.name()));
    }
  }
}

}  // namespace opserve::soak
