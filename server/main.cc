// opserve: the server binary. Parses flags, chooses the backend, starts the device worker, the
// gRPC server and the metrics exposer, and drains in-flight calls on SIGTERM / SIGINT.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mutex_checks.h"
#include "common/sanitized.h"
#include "common/status_macros.h"
#include "server/device_choice.h"
#include "server/engine/collectives.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op.h"
#include "server/rpc/host_malloc.h"
#include "server/rpc/inference_service.h"
#include "server/rpc/request_log.h"
#include "server/rpc/security.h"
#include "server/rpc/service.h"
#include "server/rpc/replica_identity.h"
#include "server/rpc/socket_drain.h"
#include "server/engine/warmup.h"
#include "server/http/http_server.h"
#if OPSERVE_WITH_CUDA
#include "server/engine/cuda_backend.h"
#endif

ABSL_FLAG(std::string, host, "0.0.0.0", "address to listen on");
ABSL_FLAG(int, port, 50051, "gRPC port (0: pick a free one and print it)");
ABSL_FLAG(std::string, replica_name, "",
          "this replica's name in the x-opserve-replica response header and in the NOT_FOUND a "
          "session that lost its replica gets (empty: <hostname>:<port>)");
ABSL_FLAG(int, http_port, 8000,
          "HTTP/REST port of the Open Inference Protocol, on --host (HTTPS with the TLS flags); "
          "0: pick a free one and print it, -1: off");
ABSL_FLAG(int, metrics_port, 9464, "Prometheus /metrics port (0: pick a free one, -1: off)");
ABSL_FLAG(std::string, device, "auto",
          "auto (every GPU, else the CPU) | cpu | cpu:N (N CPU reference devices) | cuda (every "
          "visible GPU) | cuda:I[,J...] (a list)");
ABSL_FLAG(uint64_t, max_tensor_bytes, 0,
          "largest tensor, stored or intermediate (0: the budgets of every device together, "
          "which a sharded tensor may span)");
ABSL_FLAG(uint64_t, memory_budget_bytes, 0,
          "bytes of device memory the server may hold (0: 90% of free GPU memory, or half of RAM)");
ABSL_FLAG(int, max_graph_nodes, 256, "most nodes in one Execute graph");
ABSL_FLAG(int, max_inflight, 64, "most Execute requests queued or running on the device");
ABSL_FLAG(int, lanes, 0,
          "execution lanes per device, each a thread with its own stream and cuBLAS handle, all "
          "taking requests from one queue: 1 to 64 (0: 2 on a GPU, 1 on the CPU, at most "
          "--max_inflight)");
ABSL_FLAG(int, graph_cache, 64,
          "CUDA graphs kept per execution context (--lane_contexts per lane) for replay: a graph, "
          "of one node or more, received again with the same signature runs as one launch; 0 to "
          "1024 (0: every node launched on its own)");
ABSL_FLAG(int, worker_poll_us, 2000,
          "after each job the device worker polls its queue (or for a free context) this long "
          "before it sleeps: 0 to 1000000 (0: sleep at once); requests closer together than this "
          "skip a thread wake-up");
ABSL_FLAG(int, completion_threads, opserve::DeviceWorker::kDefaultCompletionThreads,
          "threads per lane that wait for its requests' device work and send their replies: 1 "
          "to 8 (with 2, one replies while the other waits for the next request)");
ABSL_FLAG(int, lane_contexts, opserve::DeviceWorker::kDefaultContextsPerLane,
          "execution contexts per lane, each one request in flight on the lane's stream with its "
          "own timing marks, scratch and graph cache: 1 to 8 (more let a lane launch a burst of "
          "requests while earlier ones still complete)");
ABSL_FLAG(int, max_batch_size, 1,
          "most Execute and ModelInfer calls of one graph signature (structure, shapes, dtypes, "
          "algorithms) that run as one launch when they wait for the device together: 1 to 64 "
          "(1: every call runs alone); only calls whose nodes move at most 1 MiB batch, and "
          "calls that store outputs or write to shared memory always run alone");
ABSL_FLAG(int, stream_window, 16,
          "most requests of one ExecuteStream or ModelStreamInfer stream running or waiting to "
          "be written at once; the server reads no further request of that stream until one is "
          "answered (at least 1)");
ABSL_FLAG(uint64_t, max_message_bytes, 256ull << 20, "largest gRPC message, either direction");
ABSL_FLAG(std::string, trace_requests, "",
          "write each Execute and ModelInfer call's timeline (the moment it passed each stage, "
          "receipt to reply) to this CSV file when the server stops; the first 262144 calls "
          "(scripts/trace-stages.py summarises it)");
ABSL_FLAG(bool, retain_freed_host_memory, true,
          "keep freed host memory mapped for reuse, so that large requests' receive buffers are "
          "not faulted in anew on every call (false: glibc's malloc defaults)");
ABSL_FLAG(bool, log_requests, false,
          "one line on stderr per call: method, model, tenant, code, duration, bytes, peer");
ABSL_FLAG(uint32_t, chunk_bytes, 1u << 20, "default GetTensor chunk size");
ABSL_FLAG(int, shutdown_grace_seconds, 30, "how long SIGTERM waits for calls in flight");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (turns TLS on, with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA of client certificates (turns mutual TLS on)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "bearer tokens, one 'tenant:token' a line; each tenant sees only its own tensors");
ABSL_FLAG(std::string, max_compute_capability, "",
          "for testing and fleet uniformity: the CUDA backend reports at most this compute "
          "capability (MAJOR.MINOR, 8.0 or more), so ListOps, auto and validation offer only the "
          "algorithms a GPU of it runs: 8.0 on an H100 serves as an A100 would ('': the GPU's "
          "own)");
#if OPSERVE_TEST_HOOKS
ABSL_FLAG(std::string, test_fail_algorithm, "",
          "test builds only: every node running OP/ALGORITHM fails as a faulty kernel would\n"
          "(on CUDA with an illegal address: a sticky error, health turns NOT_SERVING)");
ABSL_FLAG(std::string, test_fail_device, "",
          "test builds only: NAME[@K]: the K-th request (default 1) that runs on device NAME\n"
          "injects a sticky device fault there; the device goes out of service, the others serve on");
ABSL_FLAG(std::string, test_reply_without_device, "",
          "test builds only: Execute and ModelInfer answer without running the graph, with zeros\n"
          "of the outputs' sizes: 'handler' on the gRPC thread after planning, 'launch' on a\n"
          "lane's launch thread, 'lane' through its launch and completion threads (graphs that store\n"
          "an output or write one to shared memory run)");
#endif

namespace opserve {
namespace {

// Lanes on a GPU when --lanes is 0. opserve-bench's load section measures 1, 2 and 4
// (PERFORMANCE.md): 2 lanes take most of the gain over 1, and 4 add little more while their
// kernels time-share the GPU, which inflates each node's reported kernel time. Each lane holds a
// stream, a cuBLAS handle and its workspace, and a staging area.
constexpr int kDefaultCudaLanes = 2;
// Each lane is a thread, a stream and a cuBLAS workspace outside the memory budget.
constexpr int kMaxLanes = 64;
constexpr int kMaxCompletionThreads = 8;
// A batch's plan holds every member's nodes: bounded, as a graph's nodes are.
constexpr int kMaxBatchSize = 64;
// Calls --trace_requests keeps: about ten seconds at full rate, in 22 MiB.
constexpr size_t kTracedCalls = 1 << 18;
// A graph holds device memory for its scratch (charged to the budget) and host memory for its
// instance.
constexpr int kMaxGraphCache = 1024;

// Abseil prints it after "opserve: ".
constexpr char kUsage[] =
    "GPU kernels behind a gRPC API.\n"
    "\n"
    "Usage: opserve [--flag=value ...]\n"
    "\n"
    "Serves opserve.v1.OpServe and the Open Inference Protocol (KServe v2's\n"
    "inference.GRPCInferenceService), with health and reflection, on --port, the protocol's\n"
    "HTTP/REST binding on --http_port and Prometheus metrics on --metrics_port, on the GPU of\n"
    "--device or on the CPU reference backend. SIGTERM or SIGINT\n"
    "drains the calls in flight and exits 0. --helpfull also lists the libraries' flags.";

// --help and --helpshort list this file's flags, the server's; Abseil's default looks for a
// file named after the program (opserve.cc, opserve_main.cc) and finds none. Abseil hands the
// filter each flag's file with its leading slashes removed: a suffix of __FILE__ for ours.
void SetUpUsage() {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !file.empty() && absl::EndsWith(__FILE__, file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

// --max_compute_capability as major * 10 + minor; 0 when unset.
absl::StatusOr<int> MaxComputeCapabilityFromFlag() {
  const std::string text = absl::GetFlag(FLAGS_max_compute_capability);
  if (text.empty()) return 0;
  absl::StatusOr<int> cc = ParseComputeCapability(text);
  if (!cc.ok() || *cc < kMinCudaComputeCapability) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_compute_capability must be MAJOR.MINOR, ",
        ComputeCapabilityName(kMinCudaComputeCapability),
        " or more (the oldest GPUs opserve's kernels are built for), got '", text, "'"));
  }
  return *cc;
}

// SIGTERM and SIGINT are blocked in every thread (main() blocks them before the first thread
// starts, and threads inherit the mask) and taken synchronously by sigwait on a thread of their
// own. With a handler instead, the kernel may deliver the signal to any thread; under
// ThreadSanitizer a handler runs only when its thread next enters an intercepted call, and a gRPC
// thread parked in a raw futex never does, and the server would never see the SIGTERM.
sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// The signal thread: before the server listens (g_serving false), a signal ends the process as
// the default action always did, so a start-up that hangs can still be stopped; once it listens,
// the first signal starts the drain (g_signal) and the thread ends.
std::atomic<bool> g_serving{false};
std::mutex g_signal_mu;
std::condition_variable g_signal_cv;
int g_signal = 0;  // under g_signal_mu

void SignalThread() {
  const sigset_t set = TerminationSignals();
  int sig = 0;
  if (sigwait(&set, &sig) != 0) sig = SIGTERM;  // EINVAL only, impossible for this set
  if (!g_serving.load()) {
    std::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);        // to this thread, where it is unblocked: the default action ends the process
    _exit(128 + sig);  // not reached
  }
  {
    std::lock_guard<std::mutex> lock(g_signal_mu);
    g_signal = sig;
  }
  g_signal_cv.notify_all();
}

// Blocks until the signal thread has taken SIGTERM or SIGINT; returns which.
int WaitForTerminationSignal() {
  std::unique_lock<std::mutex> lock(g_signal_mu);
  g_signal_cv.wait(lock, [] { return g_signal != 0; });
  return g_signal;
}

// The service's options from the flags; the tensor limit defaults to the memory budget.
// --lanes, or for 0 the backend's default, never more than requests may be in flight
// (ServiceOptionsFromFlags has checked that --max_inflight is at least 1).
absl::StatusOr<int> LanesFromFlags(const Backend& backend) {
  const int lanes = absl::GetFlag(FLAGS_lanes);
  const int max_inflight = absl::GetFlag(FLAGS_max_inflight);
  if (lanes < 0 || lanes > kMaxLanes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lanes must be 0 (the default) to ", kMaxLanes, ", got ", lanes));
  }
  if (lanes > max_inflight) {
    return absl::InvalidArgumentError(absl::StrCat("--lanes=", lanes, " is more than --max_inflight=",
                                                   max_inflight, ": a lane would never have work"));
  }
  if (lanes > 0) return lanes;
  return std::min(max_inflight, backend.name() == "cuda" ? kDefaultCudaLanes : 1);
}

absl::StatusOr<int> CompletionThreadsFromFlags() {
  const int threads = absl::GetFlag(FLAGS_completion_threads);
  if (threads < 1 || threads > kMaxCompletionThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--completion_threads must be 1 to ",
                                                   kMaxCompletionThreads, ", got ", threads));
  }
  return threads;
}

absl::StatusOr<int> LaneContextsFromFlags() {
  const int contexts = absl::GetFlag(FLAGS_lane_contexts);
  if (contexts < 1 || contexts > opserve::DeviceWorker::kMaxContextsPerLane) {
    return absl::InvalidArgumentError(absl::StrCat("--lane_contexts must be 1 to ",
                                                   opserve::DeviceWorker::kMaxContextsPerLane,
                                                   ", got ", contexts));
  }
  return contexts;
}

// A lane that polls for longer than this between requests would hold a core for nothing.
constexpr int kMaxWorkerPollUs = 1000000;

absl::StatusOr<std::chrono::microseconds> WorkerPollFromFlags() {
  const int us = absl::GetFlag(FLAGS_worker_poll_us);
  if (us < 0 || us > kMaxWorkerPollUs) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_poll_us must be 0 to ", kMaxWorkerPollUs, ", got ", us));
  }
  return std::chrono::microseconds(us);
}

absl::StatusOr<ServiceOptions> ServiceOptionsFromFlags(uint64_t budget) {
  // A limit of 0 would start a server that refuses every request: say so at start-up instead.
  struct AtLeast {
    const char* flag;
    int64_t value, min;
  };
  for (const AtLeast& f : {AtLeast{"--max_inflight", absl::GetFlag(FLAGS_max_inflight), 1},
                           AtLeast{"--max_graph_nodes", absl::GetFlag(FLAGS_max_graph_nodes), 1},
                           AtLeast{"--stream_window", absl::GetFlag(FLAGS_stream_window), 1},
                           AtLeast{"--shutdown_grace_seconds",
                                   absl::GetFlag(FLAGS_shutdown_grace_seconds), 0},
                           AtLeast{"--max_message_bytes",
                                   static_cast<int64_t>(std::min<uint64_t>(
                                       absl::GetFlag(FLAGS_max_message_bytes), INT64_MAX)),
                                   1024}}) {
    if (f.value < f.min) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.flag, " must be at least ", f.min, ", got ", f.value));
    }
  }
  const int max_batch = absl::GetFlag(FLAGS_max_batch_size);
  if (max_batch < 1 || max_batch > kMaxBatchSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_batch_size must be 1 to ", kMaxBatchSize, ", got ", max_batch));
  }
  ServiceOptions options;
  options.max_batch_size = max_batch;
  options.stream_window = absl::GetFlag(FLAGS_stream_window);
  options.limits.max_tensor_bytes =
      absl::GetFlag(FLAGS_max_tensor_bytes) ? absl::GetFlag(FLAGS_max_tensor_bytes) : budget;
  options.limits.max_graph_nodes = absl::GetFlag(FLAGS_max_graph_nodes);
  // gRPC counts message sizes in an int.
  options.limits.max_message_bytes =
      std::min<uint64_t>(absl::GetFlag(FLAGS_max_message_bytes), INT32_MAX);
  options.default_chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (!absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
    auto tokens = LoadTokens(absl::GetFlag(FLAGS_auth_tokens_file));
    if (!tokens.ok()) return tokens.status();
    options.tokens = *std::move(tokens);
  }
#if OPSERVE_TEST_HOOKS
  options.fail_algorithm = absl::GetFlag(FLAGS_test_fail_algorithm);
  options.reply_without_device = absl::GetFlag(FLAGS_test_reply_without_device);
  options.fail_device = absl::GetFlag(FLAGS_test_fail_device);
  if (const std::string& m = options.reply_without_device;
      !m.empty() && m != "handler" && m != "launch" && m != "lane") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--test_reply_without_device must be handler, launch, lane or empty, got '", m, "'"));
  }
#endif
  return options;
}

// The metrics exposer, or nullptr with --metrics_port=-1. Every kernel each device can run has
// its series at 0 from the first scrape, labelled as the executor's RecordKernel labels them:
// the table's op and algorithm names, and the device's.
absl::StatusOr<std::unique_ptr<Metrics>> StartMetrics(
    const std::vector<std::unique_ptr<Backend>>& backends, const std::vector<std::string>& devices) {
  if (absl::GetFlag(FLAGS_metrics_port) < 0) return nullptr;
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(absl::StrCat(absl::GetFlag(FLAGS_host), ":",
                                                absl::GetFlag(FLAGS_metrics_port)),
                                   devices, backends.front()->name(), MetricRpcNames(),
                                   QueuedRpcNames()));
  for (size_t i = 0; i < backends.size(); ++i) {
    for (const OpSpec& op : Ops()) {
      for (const AlgoSpec* algo : AlgorithmsFor(op.name, *backends[i])) {
        metrics->device(static_cast<int>(i))
            .InitKernelSeries(std::string_view(op.name.data(), op.name.size()),
                              std::string_view(algo->name.data(), algo->name.size()));
      }
    }
  }
  return metrics;
}

// Runs each CUDA algorithm once before the server listens (warmup.h says why); a failure only
// makes the first requests slower.
void WarmUp(Device& device) {
  if (device.backend().name() != "cuda") return;
  const auto t0 = std::chrono::steady_clock::now();
  auto runs = WarmUpKernels(device);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (runs.ok()) {
    std::cerr << "opserve: warm-up: " << *runs << " kernel runs in " << static_cast<int>(ms)
              << " ms" << std::endl;
  } else {
    std::cerr << "opserve: warm-up stopped (first requests will be slower): " << runs.status()
              << std::endl;
  }
}

// Refuses new calls, lets those in flight finish (up to --shutdown_grace_seconds), then closes
// the connections that are left.
void Drain(grpc::Server& server, const ServerCore& core) {
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  std::atomic<bool> shut_down{false};
  std::thread shutdown([&] {
    server.Shutdown(deadline);
    shut_down = true;
  });
  // gRPC's Shutdown refuses new calls at once, but returns only when every client has closed
  // its connection, or at the deadline: one idle client kept it waiting 8-22 s. So once every
  // call a handler accepted is done, close the connections that are left.
  const auto begun = std::chrono::system_clock::now() + std::chrono::milliseconds(50);
  while (!shut_down && std::chrono::system_clock::now() < deadline &&
         (core.active_calls() > 0 || std::chrono::system_clock::now() < begun)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!shut_down) {
    // Calls answered inline (List*, Delete) get their responses onto the wire first.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Then every response the clients have not yet read reaches them: closing a connection
    // with bytes still queued can reset it and cut a response short (socket_drain.h).
    if (!WaitForSocketsToFlush(deadline)) {
      std::cerr << "opserve: " << UnacknowledgedSocketBytes()
                << " response bytes still unread by clients at the grace deadline" << std::endl;
    }
    grpc_server_cancel_all_calls(server.c_server());
  }
  shutdown.join();
}

int Run() {
  std::thread(SignalThread).detach();  // blocked in sigwait when the process ends: nothing to join
  // Checked before the backend is chosen: a bad value stops the server on any machine.
  absl::StatusOr<int> max_cc = MaxComputeCapabilityFromFlag();
  if (!max_cc.ok()) {
    std::cerr << "opserve: " << max_cc.status() << std::endl;
    return 2;
  }
  const int graph_cache = absl::GetFlag(FLAGS_graph_cache);
  if (graph_cache < 0 || graph_cache > kMaxGraphCache) {
    std::cerr << "opserve: --graph_cache must be 0 to " << kMaxGraphCache << ", got "
              << graph_cache << std::endl;
    return 2;
  }
  auto backends_or = ChooseBackends(absl::GetFlag(FLAGS_device),
                                    absl::GetFlag(FLAGS_memory_budget_bytes), *max_cc, graph_cache);
  if (!backends_or.ok()) {
    std::cerr << "opserve: " << backends_or.status() << std::endl;
    return 2;
  }
  std::vector<std::unique_ptr<Backend>> backends = *std::move(backends_or);
  // Without --max_tensor_bytes a tensor may be as large as the node holds: a sharded one spreads
  // over every device's budget, and an unsharded one still has to fit its device's.
  uint64_t total_budget = 0;
  std::vector<std::string> device_names;
  std::vector<int> cuda_ordinals;
  for (const auto& b : backends) {
    total_budget += b->Memory().budget;
    device_names.push_back(b->device());
    if (b->name() == "cuda") cuda_ordinals.push_back(std::atoi(b->device().c_str() + 5));
  }
  const Backend& first = *backends.front();

  auto options_or = ServiceOptionsFromFlags(total_budget);
  if (!options_or.ok()) {
    std::cerr << "opserve: " << options_or.status() << std::endl;
    return 2;
  }
  ServiceOptions options = *std::move(options_or);
  const std::string trace_path = absl::GetFlag(FLAGS_trace_requests);
  std::unique_ptr<RequestTrace> trace;
  if (!trace_path.empty()) {
    trace = std::make_unique<RequestTrace>(kTracedCalls);
    options.trace = trace.get();
  }
  auto credentials = MakeServerCredentials(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                           absl::GetFlag(FLAGS_tls_client_ca));
  if (!credentials.ok()) {
    std::cerr << "opserve: " << credentials.status() << std::endl;
    return 2;
  }

  auto metrics_or = StartMetrics(backends, device_names);
  if (!metrics_or.ok()) {
    std::cerr << "opserve: metrics: " << metrics_or.status() << std::endl;
    return 2;
  }
  std::unique_ptr<Metrics> metrics = *std::move(metrics_or);

  auto lanes_or = LanesFromFlags(first);
  if (!lanes_or.ok()) {
    std::cerr << "opserve: " << lanes_or.status() << std::endl;
    return 2;
  }
  const int lanes = *lanes_or;
  auto completion_threads = CompletionThreadsFromFlags();
  if (!completion_threads.ok()) {
    std::cerr << "opserve: " << completion_threads.status() << std::endl;
    return 2;
  }
  auto lane_contexts = LaneContextsFromFlags();
  if (!lane_contexts.ok()) {
    std::cerr << "opserve: " << lane_contexts.status() << std::endl;
    return 2;
  }
  auto worker_poll = WorkerPollFromFlags();
  if (!worker_poll.ok()) {
    std::cerr << "opserve: " << worker_poll.status() << std::endl;
    return 2;
  }
  if (backends.size() > 1) std::cerr << "opserve: " << backends.size() << " devices" << std::endl;
  std::cerr << "opserve: " << lanes << (lanes == 1 ? " lane" : " lanes")
            << (backends.size() > 1 ? " per device" : "") << std::endl;
  // Copies between the devices: peer copies and NCCL on GPUs, memcpy on CPU devices.
  std::unique_ptr<Collectives> collectives =
#if OPSERVE_WITH_CUDA
      !cuda_ordinals.empty() ? NewCudaCollectives(cuda_ordinals) :
#endif
                             NewHostCollectives(static_cast<int>(backends.size()));
  if (backends.size() > 1) {
    std::cerr << "opserve: between devices: " << collectives->name() << "\n"
              << collectives->Topology() << std::flush;
  }
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<Device*> device_ptrs;
  for (size_t i = 0; i < backends.size(); ++i) {
    if (metrics) metrics->device(static_cast<int>(i)).InitLanes(lanes);
    DeviceMetrics* lane_metrics = metrics ? &metrics->device(static_cast<int>(i)) : nullptr;
    auto device_or = Device::Start(
        std::move(backends[i]), lanes, absl::GetFlag(FLAGS_max_inflight), *worker_poll,
        [lane_metrics](int lane, int running) {
          if (lane_metrics != nullptr) lane_metrics->SetLaneInflight(lane, running);
        },
        *completion_threads, *lane_contexts);
    if (!device_or.ok()) {
      std::cerr << "opserve: device worker of " << device_names[i] << ": " << device_or.status()
                << std::endl;
      return 2;
    }
    WarmUp(**device_or);
    device_ptrs.push_back(device_or->get());
    devices.push_back(*std::move(device_or));
  }
  TensorStore store;
  ServerCore core(device_ptrs, store, metrics.get(), collectives.get(), options);
  core.UpdateStoreGauges();

  // A supervisor may signal the moment it sees the listening line: g_serving is set before the
  // line is printed, so such a signal starts the drain (and one sent earlier ended the process).
  // Set before the server starts (worker jobs read it): a device that fails turns health
  // NOT_SERVING once the health service exists; until then the check after start covers it.
  std::atomic<grpc::HealthCheckServiceInterface*> health_service{nullptr};
  std::atomic<bool> reported_unhealthy{false};
  core.set_on_unhealthy([&health_service, &reported_unhealthy] {
    grpc::HealthCheckServiceInterface* h = health_service.load();
    if (h == nullptr) return;
    h->SetServingStatus(false);
    if (!reported_unhealthy.exchange(true)) {
      std::cerr << "opserve: every device failed; health is NOT_SERVING" << std::endl;
    }
  });
  // The Open Inference Protocol's ServerReady: false from the drain on, or once every device
  // failed.
  std::atomic<bool> draining{false};
  OpServeService service(core);
  InferenceService inference(core, [&draining, &core] {
    return !draining.load() && core.engine().AnyServing().ok();
  });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ReplicaIdentity replica;
  {
    // One list: each SetInterceptorCreators call replaces the previous one's.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(replica.InterceptorFactory());
    if (absl::GetFlag(FLAGS_log_requests)) interceptors.push_back(MakeRequestLog(options.tokens));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  int port = 0;
  builder.AddListeningPort(absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port)),
                           *credentials, &port);
  const int max_message = static_cast<int>(options.limits.max_message_bytes);
  // A 64 MiB HTTP/2 stream window: uploads of large tensors stop waiting on window updates
  // (client/TUNING.md).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  // No SO_REUSEPORT: gRPC sets it by default, and then a second server on a port in use starts
  // and the kernel splits the connections between the two. Each holds its own tensors, so a
  // client's put and its next get could land on different servers; the second start fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterService(&service);
  builder.RegisterService(&inference);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "opserve: cannot listen on " << absl::GetFlag(FLAGS_host) << ":"
              << absl::GetFlag(FLAGS_port)
              << ": the port is in use by another process, or the host is not an address of "
                 "this machine"
              << std::endl;
    return 2;
  }
  const std::string replica_name = absl::GetFlag(FLAGS_replica_name);
  replica.set_name(replica_name.empty() ? DefaultReplicaName(port) : replica_name);
  std::unique_ptr<http::HttpServer> http_server;
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    // HTTP requests become calls of the same services through the server's in-process
    // channel, under the server's own message limits.
    grpc::ChannelArguments in_process;
    in_process.SetMaxReceiveMessageSize(-1);
    in_process.SetMaxSendMessageSize(-1);
    auto started = http::HttpServer::Start(
        {absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_http_port), absl::GetFlag(FLAGS_tls_cert),
         absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_client_ca),
         options.limits.max_message_bytes, replica.name()},
        server->InProcessChannel(in_process));
    if (!started.ok()) {
      std::cerr << "opserve: " << started.status().message() << std::endl;
      server->Shutdown();
      return 2;
    }
    http_server = *std::move(started);
    std::cerr << "opserve: HTTP" << (http_server->tls() ? "S" : "") << " on "
              << absl::GetFlag(FLAGS_host) << ":" << http_server->port() << std::endl;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health_service.store(health);
  for (int i = 0; i < core.engine().num_devices(); ++i) {  // failed in the warm-up
    if (absl::Status h = core.engine().backend(i).Healthy(); !h.ok()) core.engine().MarkFailed(i, h);
  }
  g_serving.store(true);  // from here a signal drains instead of ending the process
  std::cerr << "opserve: replica " << replica.name() << std::endl;
  std::cerr << "opserve: listening on " << absl::GetFlag(FLAGS_host) << ":" << port << std::endl;

  const int sig = WaitForTerminationSignal();

  std::cerr << "opserve: signal " << sig << ", draining" << std::endl;
  health->SetServingStatus(false);
  draining.store(true);
  if (http_server) http_server->Stop();  // answers the requests it has, through the server
  Drain(*server, core);
  for (auto& d : devices) d->Shutdown();
  if (trace) {  // every call is done: the drain waited for them
    if (absl::Status s = trace->WriteCsv(trace_path); !s.ok()) {
      std::cerr << "opserve: " << s << std::endl;
    } else {
      std::cerr << "opserve: request timelines written to " << trace_path << std::endl;
    }
  }
  std::cerr << "opserve: stopped" << std::endl;
  return 0;
}

}  // namespace
}  // namespace opserve

int main(int argc, char** argv) {
  // Before any thread exists, so that every thread inherits the mask (see TerminationSignals).
  const sigset_t termination = opserve::TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &termination, nullptr);
  opserve::SetUpUsage();
  absl::ParseCommandLine(argc, argv);  // --help and the other usage flags print and exit 1 here
  opserve::SkipMutexDeadlockChecks();
#if !OPSERVE_SANITIZED
  // Before the server allocates much (sanitizer builds bring allocators of their own).
  if (absl::Status s = opserve::RetainFreedHostMemory(
          absl::GetFlag(FLAGS_retain_freed_host_memory) ? opserve::kRetainedTopBytes : 0);
      !s.ok()) {
    std::cerr << "opserve: " << s << std::endl;
    return 2;
  }
  // A crash prints the signal and a symbolized stack to stderr before the process dies, so the
  // log says where. Sanitizer builds keep their own, more detailed, handlers.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
#endif
  // A gRPC reference this process never gives back, so that exit skips grpc_shutdown: in
  // Debian's gRPC 1.51 it joins an executor thread parked in a ~10 s epoll timeout, and a
  // drained server took that long to exit after "stopped" whenever a client had connected.
  grpc_init();
  return opserve::Run();
}
