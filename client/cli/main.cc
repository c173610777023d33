// opserve-cli: a command-line client for opserve.
//
//   opserve-cli [--target HOST:PORT] [--token T] [--json] COMMAND [ARGS]
//
// Exit status: 0 on success, 1 on any failure (a gRPC error prints its code name and message),
// 2 on a usage error (one line on stderr; --help prints the whole usage).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cli/bench.h"
#include "client/cli/format.h"
#include "client/cli/progress.h"
#include "client/cli/proto_json.h"
#include "client/cli/run.h"
#include "client/npy.h"
#include "client/opserve_client.h"
#include "common/mutex_checks.h"

namespace opserve::cli {
namespace {

using client::HostTensor;

// Calls that run no graph answer in milliseconds; one still waiting after this is talking to a
// server that accepted the connection and does not answer (stopped, or not opserve at all).
// Transfers take it as the longest a chunk may stall rather than a deadline, since their length
// grows with the tensor; graph runs get no deadline, since a big graph legitimately runs long.
constexpr absl::Duration kDefaultDeadline = absl::Seconds(30);

constexpr char kUsage[] = R"(usage: opserve-cli [FLAGS] COMMAND [ARGS]

commands:
  health                      is the server serving? (exit 0 if so)
  ops                         the server's devices (memory, state) and the ops and algorithms
                              it offers
  put NAME FILE.npy           upload a .npy file as tensor NAME (--overwrite to replace;
                              --device=NAME or --shard to place it)
  get NAME FILE.npy           download tensor NAME into a .npy file
                              (put and get draw a progress bar over 64 MiB when stderr is a
                              terminal)
  ls                          list stored tensors, where each lives and a sharded one's parts
  rm NAME                     delete tensor NAME
  move NAME DEVICE            move tensor NAME to DEVICE (a sharded one is gathered there)
  run GRAPH.json              execute a graph (ExecuteRequest JSON; inline tensors may be
                              {"npy": "file.npy"}, relative to the graph file); warns when the
                              graph neither returns nor stores an output
  bench                       load the server with one graph at a concurrency or a sweep of
                              them: throughput, latency percentiles, GB/s (flags below)

flags:
  --target=HOST:PORT          server address (default $OPSERVE_TARGET or 127.0.0.1:50051)
  --token=T                   bearer token (default $OPSERVE_TOKEN)
  --session=ID                x-opserve-session metadata, for proxies that route a session's
                              calls to one replica (default $OPSERVE_SESSION)
  --json                      machine-readable output: one JSON object (bench: its levels as
                              they are measured), integers as JSON numbers
  --timeout=SECONDS           deadline of each call, graph runs included (default: 30 s for
                              calls that run no graph, put and get over the socket give up
                              after 30 s without progress instead; run: none; bench: 60 s)
  --chunk_bytes=N             transfer chunk size (default 4190208: 4 MiB less a page)
  --root_ca=PEM               use TLS with this root CA
  --client_cert=PEM --client_key=PEM   mutual TLS
  --overwrite                 put: replace an existing tensor
  --device=NAME               put: store it on this device of the server (as `ops` names
                              them, e.g. cuda:1; default: the one with the most free memory)
  --shard                     put: split a matrix by rows over every serving device
  --shm                       put, get: move the bytes through a POSIX shared-memory object
                              registered with the server (same host only) instead of the socket

)";

struct Flags {
  client::ClientOptions client;
  std::optional<absl::Duration> timeout;  // --timeout
  bool json = false;
  bool overwrite = false;
  bool shm = false;
  client::Placement placement;    // --device, --shard
  std::string first_put_flag;     // placement flags belong to put alone
  BenchOptions bench;
  std::string first_bench_flag;   // bench flags belong to bench alone
  std::vector<std::string> args;  // the command and its arguments
};

// Flags may come before or after the command, as --name=value or --name value.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  if (const char* target = std::getenv("OPSERVE_TARGET")) flags.client.target = target;
  if (const char* token = std::getenv("OPSERVE_TOKEN")) flags.client.bearer_token = token;
  if (const char* session = std::getenv("OPSERVE_SESSION")) flags.client.session = session;
  const std::set<std::string> with_value = {"target",     "token",      "session",
                                            "timeout",    "root_ca",    "client_cert",
                                            "client_key", "chunk_bytes", "device"};
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (flags_done || arg.size() < 3 || arg.rfind("--", 0) != 0) {
      flags.args.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    bool bench_takes_value = false;
    const bool bench_flag = IsBenchFlag(name, &bench_takes_value);
    const bool takes_value = with_value.count(name) > 0 || (bench_flag && bench_takes_value);
    if (takes_value && !has_value) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    } else if (!takes_value && has_value) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
    }
    double seconds = 0;
    int64_t number = 0;
    if (name == "target") {
      flags.client.target = value;
    } else if (name == "token") {
      flags.client.bearer_token = value;
    } else if (name == "session") {
      flags.client.session = value;
    } else if (name == "root_ca") {
      flags.client.root_ca_path = value;
    } else if (name == "client_cert") {
      flags.client.client_cert_path = value;
    } else if (name == "client_key") {
      flags.client.client_key_path = value;
    } else if (name == "timeout") {
      if (!absl::SimpleAtod(value, &seconds) || seconds <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--timeout wants seconds > 0, got '", value, "'"));
      }
      flags.timeout = absl::Seconds(seconds);
    } else if (name == "chunk_bytes") {
      if (!absl::SimpleAtoi(value, &number) || number <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " wants a positive integer, got '", value, "'"));
      }
      flags.client.chunk_bytes = number;
    } else if (bench_flag) {
      if (absl::Status s = SetBenchFlag(name, value, &flags.bench); !s.ok()) return s;
      if (flags.first_bench_flag.empty()) flags.first_bench_flag = name;
    } else if (name == "json") {
      flags.json = true;
    } else if (name == "overwrite") {
      flags.overwrite = true;
    } else if (name == "shm") {
      flags.shm = true;
    } else if (name == "device" || name == "shard") {
      if (name == "device") {
        if (value.empty()) return absl::InvalidArgumentError("--device needs a device name");
        flags.placement.device = value;
      } else {
        flags.placement.shard = true;
      }
      if (flags.first_put_flag.empty()) flags.first_put_flag = name;
    } else if (name == "help") {
      flags.args = {"help"};
      return flags;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return flags;
}

// A gRPC failure: the code name and the message. Local failures carry their message alone.
int Fail(const absl::Status& status, bool from_server) {
  std::cerr << FailureText(status, from_server) << "\n";
  return 1;
}

// A usage error: one line naming the problem, and where the rest is.
int UsageError(absl::string_view message) {
  std::cerr << "opserve-cli: " << message << " (see opserve-cli --help)\n";
  return 2;
}

// Put and get without --timeout: no deadline for the whole transfer, but a limit on a stall.
client::CallOptions TransferCall(const Flags& flags, ProgressBar* progress) {
  client::CallOptions call;
  if (!flags.timeout.has_value()) {
    // Through shared memory the bytes move inside unary calls: a plain deadline bounds them.
    (flags.shm ? call.timeout : call.idle_timeout) = kDefaultDeadline;
  }
  call.progress = [progress](uint64_t done, uint64_t total) { progress->Update(done, total); };
  return call;
}

double Gbps(uint64_t bytes, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

int Health(client::Client& c, const Flags& flags) {
  absl::StatusOr<bool> serving = c.HealthServing();
  if (!serving.ok()) return Fail(serving.status(), true);
  if (flags.json) {
    std::cout << "{\"serving\": " << (*serving ? "true" : "false") << "}\n";
  } else {
    std::cout << (*serving ? "SERVING" : "NOT_SERVING") << "\n";
  }
  return *serving ? 0 : 1;
}

int Ops(client::Client& c, const Flags& flags) {
  absl::StatusOr<v1::ListOpsResponse> ops = c.ListOps();
  if (!ops.ok()) return Fail(ops.status(), true);
  if (flags.json) {
    std::cout << ProtoJson(*ops) << "\n";
    return 0;
  }
  std::cout << OpsText(*ops);
  return 0;
}

int Put(client::Client& c, const Flags& flags, const std::string& name, const std::string& path) {
  absl::StatusOr<HostTensor> tensor = client::ReadNpyFile(path);
  if (!tensor.ok()) return Fail(tensor.status(), false);
  ProgressBar progress(absl::StrCat("put ", name));
  const client::CallOptions call = TransferCall(flags, &progress);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::TensorInfo> info =
      flags.shm ? c.PutTensorShm(name, *tensor, flags.overwrite, flags.placement, call)
                : c.PutTensor(name, *tensor, flags.overwrite, flags.placement, call);
  const absl::Duration elapsed = absl::Now() - start;
  progress.Finish();
  if (!info.ok()) return Fail(info.status(), true);
  const double gbps = Gbps(tensor->data.size(), elapsed);
  if (flags.json) {
    std::cout << "{\"info\": " << ProtoJson(*info)
              << ", \"seconds\": " << absl::ToDoubleSeconds(elapsed) << ", \"gbps\": " << gbps
              << "}\n";
  } else {
    std::cout << absl::StrFormat("put %s in %.3f ms, %.2f GB/s\n", InfoLine(*info),
                                 absl::ToDoubleMilliseconds(elapsed), gbps)
              << ShardLines(*info);
  }
  return 0;
}

int Get(client::Client& c, const Flags& flags, const std::string& name, const std::string& path) {
  ProgressBar progress(absl::StrCat("get ", name));
  const client::CallOptions call = TransferCall(flags, &progress);
  const absl::Time start = absl::Now();
  absl::StatusOr<HostTensor> tensor =
      flags.shm ? c.GetTensorShm(name, call) : c.GetTensor(name, call);
  const absl::Duration elapsed = absl::Now() - start;
  progress.Finish();
  if (!tensor.ok()) return Fail(tensor.status(), true);
  if (absl::Status written = client::WriteNpyFile(path, *tensor); !written.ok()) {
    return Fail(written, false);
  }
  const double gbps = Gbps(tensor->data.size(), elapsed);
  if (flags.json) {
    std::cout << absl::StrFormat(
        "{\"name\": %s, \"dtype\": \"%s\", \"shape\": [%s], \"bytes\": %d, \"seconds\": %g, "
        "\"gbps\": %g, \"file\": %s}\n",
        JsonQuote(name), v1::DType_Name(tensor->dtype), absl::StrJoin(tensor->shape, ", "),
        tensor->data.size(), absl::ToDoubleSeconds(elapsed), gbps, JsonQuote(path));
  } else {
    std::cout << absl::StrFormat(
        "got %s: %s%s, %s in %.3f ms, %.2f GB/s -> %s\n", name, client::DTypeName(tensor->dtype),
        client::ShapeString(tensor->shape), FormatBytes(tensor->data.size()),
        absl::ToDoubleMilliseconds(elapsed), gbps, path);
  }
  return 0;
}

int List(client::Client& c, const Flags& flags) {
  absl::StatusOr<std::vector<v1::TensorInfo>> tensors = c.ListTensors();
  if (!tensors.ok()) return Fail(tensors.status(), true);
  if (flags.json) {
    v1::ListTensorsResponse response;
    for (const v1::TensorInfo& info : *tensors) *response.add_tensors() = info;
    std::cout << ProtoJson(response) << "\n";
    return 0;
  }
  Table table({{"name"}, {"dtype"}, {"shape"}, {"bytes", true}, {"device"}});
  for (const v1::TensorInfo& info : *tensors) {
    table.AddRow(
        {info.name(), std::string(client::DTypeName(info.dtype())),
         client::ShapeString(std::vector<int64_t>(info.shape().begin(), info.shape().end())),
         absl::StrCat(info.bytes()), info.device()});
    // A sharded tensor's parts below it, one row each: which rows live where.
    for (int i = 0; i < info.shards_size(); ++i) {
      const v1::TensorShard& shard = info.shards(i);
      table.AddRow({absl::StrCat("  shard ", i), "", RowRange(shard),
                    absl::StrCat(shard.bytes()), shard.device()});
    }
  }
  std::cout << table.Render();
  return 0;
}

int Remove(client::Client& c, const Flags& flags, const std::string& name) {
  absl::StatusOr<v1::TensorInfo> info = c.DeleteTensor(name);
  if (!info.ok()) return Fail(info.status(), true);
  if (flags.json) {
    std::cout << "{\"deleted\": " << ProtoJson(*info) << "}\n";
  } else {
    std::cout << "deleted " << InfoLine(*info) << "\n";
  }
  return 0;
}

int Move(client::Client& c, const Flags& flags, const std::string& name,
         const std::string& device) {
  absl::StatusOr<v1::MoveTensorResponse> moved = c.MoveTensor(name, device);
  if (!moved.ok()) return Fail(moved.status(), true);
  if (flags.json) {
    std::cout << ProtoJson(*moved) << "\n";
  } else if (moved->bytes() == 0) {
    std::cout << InfoLine(moved->info()) << " (there already, nothing moved)\n";
  } else {
    const double seconds = moved->seconds();
    std::cout << absl::StrFormat(
        "moved %s (%s copied in %.3f ms, %.2f GB/s)\n", InfoLine(moved->info()),
        FormatBytes(moved->bytes()), seconds * 1e3,
        seconds > 0 ? static_cast<double>(moved->bytes()) / seconds / 1e9 : 0);
  }
  return 0;
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return UsageError(flags.status().message());
  const std::vector<std::string>& args = flags->args;
  if (args.empty()) {
    return UsageError(
        "no command given; one of health, ops, put, get, ls, rm, move, run, bench");
  }
  if (args[0] == "help" || args[0] == "-h") {
    std::cout << kUsage << kBenchUsage;
    return 0;
  }
  const std::map<std::string, size_t> arity = {{"health", 1}, {"ops", 1}, {"put", 3},
                                               {"get", 3},    {"ls", 1},  {"rm", 2},
                                               {"move", 3},   {"run", 2}, {"bench", 1}};
  const auto expected = arity.find(args[0]);
  if (expected == arity.end()) {
    return UsageError(absl::StrCat("unknown command '", args[0], "'"));
  }
  if (args.size() != expected->second) {
    return UsageError(absl::StrCat(args[0], " takes ", expected->second - 1, " argument(s), got ",
                                   args.size() - 1));
  }
  if (args[0] != "bench" && !flags->first_bench_flag.empty()) {
    return UsageError(
        absl::StrCat("--", flags->first_bench_flag, " is a flag of bench, not of ", args[0]));
  }
  if (args[0] != "put" && !flags->first_put_flag.empty()) {
    return UsageError(
        absl::StrCat("--", flags->first_put_flag, " is a flag of put, not of ", args[0]));
  }
  if (flags->placement.shard && !flags->placement.device.empty()) {
    return UsageError("--shard spreads the tensor over every device; it takes no --device");
  }
  // Graph runs and transfers take their limits per call (Run, TransferCall); bench sets its own.
  const bool per_call = args[0] == "run" || args[0] == "bench" || args[0] == "put" ||
                        args[0] == "get";
  flags->client.timeout =
      flags->timeout.value_or(per_call ? absl::InfiniteDuration() : kDefaultDeadline);
  absl::StatusOr<std::unique_ptr<client::Client>> connected =
      client::Client::Connect(flags->client);
  if (!connected.ok()) return Fail(connected.status(), false);
  client::Client& c = **connected;
  const std::string& command = args[0];
  if (command == "health") return Health(c, *flags);
  if (command == "ops") return Ops(c, *flags);
  if (command == "put") return Put(c, *flags, args[1], args[2]);
  if (command == "get") return Get(c, *flags, args[1], args[2]);
  if (command == "ls") return List(c, *flags);
  if (command == "rm") return Remove(c, *flags, args[1]);
  if (command == "move") return Move(c, *flags, args[1], args[2]);
  if (command == "run") return RunGraph(c, args[1], flags->json, flags->timeout);
  return RunBench(c, flags->bench, flags->json, std::cout);
}

}  // namespace
}  // namespace opserve::cli

int main(int argc, char** argv) {
  opserve::SkipMutexDeadlockChecks();  // as the server does; `bench` runs many client threads
  return opserve::cli::Main(argc, argv);
}
