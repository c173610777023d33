#include "bench/kserve_bench.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"
#include "bench/bench.h"
#include "bench/harness.h"
#include "bench/service_process.h"
#include "inference/grpc_service.grpc.pb.h"

namespace opserve::bench {

// The host link's ceiling: cudaMemcpy of `bytes` from registered host memory, best of `reps`.
double RegisteredH2D(char* host, void* dev, uint64_t bytes, int reps) {
  double best = 0;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i <= reps; ++i) {
    cudaEventRecord(a);
    cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i > 0) best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

ModelInferRequest RowMean(int64_t rows, int64_t cols) {
  ModelInferRequest req;
  req.set_model_name("row_mean");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(cols);
  return req;
}

// opserve.v1's counterpart of RowMean: row_mean of inline tensor "x" holding `data`, returned.
v1::ExecuteRequest RowMeanExecute(int64_t rows, int64_t cols, std::string data) {
  v1::ExecuteRequest req;
  auto& t = (*req.mutable_inline_tensors())["x"];
  t.set_dtype(v1::FLOAT32);
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_data(std::move(data));
  auto* node = req.add_nodes();
  node->set_id("m");
  node->set_op("row_mean");
  node->add_inputs()->set_inline_name("x");
  auto* o = req.add_outputs();
  o->set_node("m");
  o->set_return_inline(true);
  return req;
}

void InRegion(ModelInferRequest& req, const std::string& region, uint64_t bytes) {
  auto& p = *req.mutable_inputs(0)->mutable_parameters();
  p["shared_memory_region"].set_string_param(region);
  p["shared_memory_byte_size"].set_uint64_param(bytes);
}

// Wall times of `reps` calls after one warm-up, and from the responses, their kernel times and
// the server's time over them (receipt to response, less the kernels); "" or why not.
std::string TimeInfer(GRPCInferenceService::Stub& stub, const ModelInferRequest& req, int reps,
                      std::vector<double>* us, std::vector<double>* kernel_us,
                      std::vector<double>* server_over_kernel_us = nullptr) {
  for (int i = 0; i <= reps; ++i) {
    grpc::ClientContext ctx;
    ModelInferResponse resp;
    const auto t0 = Clock::now();
    grpc::Status s = stub.ModelInfer(&ctx, req, &resp);
    const double wall = Us(Clock::now() - t0);
    if (!s.ok()) return absl::StrCat("ModelInfer: ", s.error_message());
    if (i == 0) continue;
    us->push_back(wall);
    const auto& p = resp.parameters();
    if (kernel_us) kernel_us->push_back(p.at("kernel_us").double_param());
    if (server_over_kernel_us) {
      server_over_kernel_us->push_back(p.at("total_us").double_param() - p.at("kernel_us").double_param());
    }
  }
  return "";
}

// `raw` as raw_input_contents of `req`, GB/s of the median of `reps` calls after a warm-up,
// alternating call by call between two clients: the generated stub, which serializes the whole
// request into fresh memory first (what tritonclient does), and the opserve client library's
// ModelInfer, which sends the bytes from `raw` itself (client/model_infer.cc).
std::string TimeRaw(Session& session, ModelInferRequest req, const std::string& raw, int reps,
                    double* stub_gbps, double* client_gbps) {
  auto stub = GRPCInferenceService::NewStub(session.raw_channel);
  ModelInferRequest copied = req;
  copied.add_raw_input_contents(raw);
  const absl::string_view view(raw);
  std::vector<double> a, b;
  for (int i = 0; i <= reps; ++i) {
    grpc::ClientContext ctx;
    ModelInferResponse resp;
    auto t0 = Clock::now();
    grpc::Status s = stub->ModelInfer(&ctx, copied, &resp);
    const double stub_us = Us(Clock::now() - t0);
    if (!s.ok()) return absl::StrCat("ModelInfer raw_input_contents: ", s.error_message());
    t0 = Clock::now();
    absl::StatusOr<ModelInferResponse> r = session.client->ModelInfer(req, {&view, 1});
    const double client_us = Us(Clock::now() - t0);
    if (!r.ok()) return absl::StrCat("Client::ModelInfer raw_input_contents: ", r.status().message());
    if (i == 0) continue;
    a.push_back(stub_us);
    b.push_back(client_us);
  }
  *stub_gbps = raw.size() / (Median(a) * 1e-6) / 1e9;
  *client_gbps = raw.size() / (Median(b) * 1e-6) / 1e9;
  return "";
}

std::string Run(const KServeOptions& opt, KServeFigures* f) {
  const uint64_t bytes = static_cast<uint64_t>(opt.rows * opt.cols) * 4;
  Session session;
  if (std::string err = session.Open(opt.opserve_bin, opt.server_args); !err.empty()) return err;
  auto stub = GRPCInferenceService::NewStub(session.raw_channel);
  auto ops = v1::OpServe::NewStub(session.raw_channel);

  // The client's POSIX shm object, filled once.
  const std::string key = absl::StrCat("/opserve-bench-", getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, bytes) != 0) return "cannot create the shm object";
  char* host = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  if (host == MAP_FAILED) return "cannot map the shm object";
  struct Cleanup {
    std::string key;
    char* host;
    uint64_t bytes;
    ~Cleanup() {
      munmap(host, bytes);
      shm_unlink(key.c_str());
    }
  } cleanup{key, host, bytes};
  const std::string x = RandomFloats(bytes / 4);
  std::memcpy(host, x.data(), bytes);

  // The ceiling, on this process's own registration of the same pages. The device buffer also
  // holds row_mean's output after the input, for the CUDA shared memory request.
  const uint64_t out_bytes = static_cast<uint64_t>(opt.rows) * 4;
  void* dev = nullptr;
  if (cudaMalloc(&dev, bytes + out_bytes) != cudaSuccess) return "cudaMalloc of the ceiling's buffer";
  cudaHostRegister(host, bytes, cudaHostRegisterDefault);
  f->h2d_registered_gbps = RegisteredH2D(host, dev, bytes, opt.reps);
  cudaHostUnregister(host);

  {  // System shared memory: ModelInfer and PutTensor name the region.
    grpc::ClientContext ctx;
    inference::SystemSharedMemoryRegisterRequest reg;
    reg.set_name("bench");
    reg.set_key(key);
    reg.set_byte_size(bytes);
    inference::SystemSharedMemoryRegisterResponse r;
    if (grpc::Status s = stub->SystemSharedMemoryRegister(&ctx, reg, &r); !s.ok()) {
      return absl::StrCat("register: ", s.error_message());
    }
  }
  ModelInferRequest req = RowMean(opt.rows, opt.cols);
  InRegion(req, "bench", bytes);
  std::vector<double> us;
  if (std::string err = TimeInfer(*stub, req, opt.reps, &us, nullptr); !err.empty()) return err;
  f->shm_infer_gbps = bytes / (Median(us) * 1e-6) / 1e9;
  us.clear();
  for (int i = 0; i <= opt.reps; ++i) {
    grpc::ClientContext ctx;
    v1::PutTensorResponse resp;
    auto writer = ops->PutTensor(&ctx, &resp);
    v1::PutTensorRequest header;
    auto* h = header.mutable_header();
    h->set_name("bench_put");
    h->set_dtype(v1::FLOAT32);
    h->add_shape(opt.rows);
    h->add_shape(opt.cols);
    h->set_overwrite(true);
    h->mutable_shm()->set_region("bench");
    h->mutable_shm()->set_byte_size(bytes);
    const auto t0 = Clock::now();
    writer->Write(header);
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    const double wall = Us(Clock::now() - t0);
    if (!s.ok()) return absl::StrCat("PutTensor from the region: ", s.error_message());
    if (i > 0) us.push_back(wall);
  }
  f->shm_put_gbps = bytes / (Median(us) * 1e-6) / 1e9;
  (void)session.client->DeleteTensor("bench_put");

  {  // CUDA shared memory: this process's device buffer, read and written in place.
    cudaIpcMemHandle_t handle;
    if (cudaIpcGetMemHandle(&handle, dev) != cudaSuccess) return "cudaIpcGetMemHandle";
    grpc::ClientContext ctx;
    inference::CudaSharedMemoryRegisterRequest reg;
    reg.set_name("bench_cuda");
    reg.set_raw_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    reg.set_device_id(0);
    reg.set_byte_size(bytes + out_bytes);
    inference::CudaSharedMemoryRegisterResponse r;
    if (grpc::Status s = stub->CudaSharedMemoryRegister(&ctx, reg, &r); !s.ok()) {
      return absl::StrCat("CUDA register: ", s.error_message());
    }
    // row_mean of the first `rows` rows, the output after the whole input; 1 GiB last.
    for (int64_t rows : {opt.rows / 1024, opt.rows / 64, opt.rows / 8, opt.rows}) {
      if (rows < 1) continue;
      const uint64_t in_bytes = static_cast<uint64_t>(rows * opt.cols) * 4;
      ModelInferRequest creq = RowMean(rows, opt.cols);
      InRegion(creq, "bench_cuda", in_bytes);
      auto& out = *creq.add_outputs();
      out.set_name("y");
      auto& op = *out.mutable_parameters();
      op["shared_memory_region"].set_string_param("bench_cuda");
      op["shared_memory_offset"].set_uint64_param(bytes);
      op["shared_memory_byte_size"].set_uint64_param(static_cast<uint64_t>(rows) * 4);
      std::vector<double> wall, kernel, server;
      if (std::string err = TimeInfer(*stub, creq, std::max(opt.reps, 21), &wall, &kernel, &server);
          !err.empty()) {
        return err;
      }
      f->cuda_sizes.push_back({in_bytes / 1048576.0, Median(wall), Median(kernel), Median(server)});
    }
    f->cuda_infer_us = f->cuda_sizes.back().wall_us;
    f->cuda_kernel_us = f->cuda_sizes.back().kernel_us;
    f->cuda_server_over_kernel_us = f->cuda_sizes.back().server_over_kernel_us;
    grpc::ClientContext uctx;
    inference::CudaSharedMemoryUnregisterRequest un;
    un.set_name("bench_cuda");
    inference::CudaSharedMemoryUnregisterResponse ur;
    (void)stub->CudaSharedMemoryUnregister(&uctx, un, &ur);
  }
  cudaFree(dev);

  {  // raw_input_contents: 128 MiB, well inside the default message limit (256 MiB with framing).
    const int64_t rows = opt.rows / 8;
    f->raw_bytes = static_cast<uint64_t>(rows * opt.cols) * 4;
    const std::string raw(host, f->raw_bytes);
    if (std::string err = TimeRaw(session, RowMean(rows, opt.cols), raw, opt.reps, &f->raw_gbps,
                                  &f->raw_client_gbps);
        !err.empty()) {
      return err;
    }
    // opserve.v1's counterpart: the same bytes as an Execute inline tensor.
    const v1::ExecuteRequest ereq = RowMeanExecute(rows, opt.cols, raw);
    us.clear();
    for (int i = 0; i <= opt.reps; ++i) {
      grpc::ClientContext ctx;
      v1::ExecuteResponse resp;
      const auto t0 = Clock::now();
      grpc::Status s = ops->Execute(&ctx, ereq, &resp);
      if (!s.ok()) return absl::StrCat("Execute 128 MiB inline: ", s.error_message());
      if (i > 0) us.push_back(Us(Clock::now() - t0));
    }
    f->execute_inline_gbps = f->raw_bytes / (Median(us) * 1e-6) / 1e9;
    // The same two against a server with glibc's malloc defaults, which give the receive
    // buffers back after each request (server/rpc/host_malloc.h).
    Session plain;
    std::vector<std::string> args = opt.server_args;
    args.push_back("--retain_freed_host_memory=false");
    if (std::string err = plain.Open(opt.opserve_bin, args); !err.empty()) return err;
    if (std::string err = TimeRaw(plain, RowMean(rows, opt.cols), raw, opt.reps,
                                  &f->raw_unretained_gbps, &f->raw_client_unretained_gbps);
        !err.empty()) {
      return absl::StrCat("with --retain_freed_host_memory=false: ", err);
    }
  }

  {  // A small inline request, both APIs, interleaved.
    const std::string small(host, 10 * 2048 * 4);
    ModelInferRequest sreq = RowMean(10, 2048);
    sreq.add_raw_input_contents(small);
    const v1::ExecuteRequest ereq = RowMeanExecute(10, 2048, small);
    std::vector<double> infer, execute;
    for (int i = 0; i < 200 + opt.small_requests; ++i) {
      grpc::ClientContext c1, c2;
      ModelInferResponse r1;
      v1::ExecuteResponse r2;
      auto t0 = Clock::now();
      grpc::Status s1 = stub->ModelInfer(&c1, sreq, &r1);
      auto t1 = Clock::now();
      grpc::Status s2 = ops->Execute(&c2, ereq, &r2);
      auto t2 = Clock::now();
      if (!s1.ok() || !s2.ok()) return absl::StrCat("small requests: ", s1.error_message(), s2.error_message());
      if (i < 200) continue;  // warm
      infer.push_back(Us(t1 - t0));
      execute.push_back(Us(t2 - t1));
    }
    f->infer_p50_us = Median(infer);
    f->execute_p50_us = Median(execute);
  }

  {  // gRPC's own floor on this host: a unary Health/Check on the same channel.
    std::vector<double> us;
    for (int i = 0; i < 200 + opt.small_requests; ++i) {
      const auto t0 = Clock::now();
      if (!HealthCheck(session.raw_channel.get())) return "Health/Check failed";
      if (i >= 200) us.push_back(Us(Clock::now() - t0));
    }
    f->health_p50_us = Median(us);
  }
  return "";
}

}  // namespace

KServeFigures RunKServeBench(const KServeOptions& options) {
  KServeFigures f;
  f.error = Run(options, &f);
  f.ran = f.error.empty();
  return f;
}

void PrintKServe(const KServeFigures& f) {
  if (!f.ran) {
    std::printf("\nOpen Inference Protocol: not measured: %s\n", f.error.c_str());
    return;
  }
  std::printf("\nOpen Inference Protocol, row_mean FP32 (medians):\n");
  std::printf("  ceiling: 1 GiB host->device from registered memory  %8.1f GB/s\n", f.h2d_registered_gbps);
  std::printf("  ModelInfer 1 GiB, system shared memory            %8.1f GB/s\n", f.shm_infer_gbps);
  std::printf("  PutTensor 1 GiB, system shared memory             %8.1f GB/s\n", f.shm_put_gbps);
  std::printf("  ModelInfer 1 GiB, CUDA shared memory in and out  %8.1f us (kernel %.1f us; "
              "server's receipt to response less the kernel %.1f us)\n",
              f.cuda_infer_us, f.cuda_kernel_us, f.cuda_server_over_kernel_us);
  std::printf("    by size (MiB: client wall, kernel, server over the kernel, client over the server; us):");
  for (const auto& p : f.cuda_sizes) {
    std::printf(" %.0f: %.1f, %.1f, %.1f, %.1f;", p.mib, p.wall_us, p.kernel_us, p.server_over_kernel_us,
                p.wall_us - p.kernel_us - p.server_over_kernel_us);
  }
  std::printf("\n");
  std::printf("  ModelInfer %llu MiB, raw_input_contents, opserve client  %8.2f GB/s (generated stub: %.2f)\n",
              static_cast<unsigned long long>(f.raw_bytes >> 20), f.raw_client_gbps, f.raw_gbps);
  std::printf("    the same, server with --retain_freed_host_memory=false     %8.2f GB/s (generated stub: %.2f)\n",
              f.raw_client_unretained_gbps, f.raw_unretained_gbps);
  std::printf("  Execute %llu MiB inline tensor (opserve.v1)          %8.2f GB/s\n",
              static_cast<unsigned long long>(f.raw_bytes >> 20), f.execute_inline_gbps);
  std::printf("  10x2048 inline: ModelInfer p50 %.1f us, Execute p50 %.1f us\n", f.infer_p50_us,
              f.execute_p50_us);
  std::printf("  gRPC's floor: unary Health/Check p50 %.1f us\n", f.health_p50_us);
}

void AddKServeTargets(const KServeFigures& f, Report& rep) {
  if (!f.ran) return;
  const double bar = 0.7 * f.h2d_registered_gbps;
  AddTarget(rep, "OIP: 1 GiB row_mean via system shm >= 0.7x registered H2D copy",
            absl::StrFormat("%.1f GB/s vs 0.7 x %.1f", f.shm_infer_gbps, f.h2d_registered_gbps),
            f.shm_infer_gbps >= bar);
  AddTarget(rep, "OIP: PutTensor 1 GiB via system shm >= 0.7x registered H2D copy",
            absl::StrFormat("%.1f GB/s vs 0.7 x %.1f", f.shm_put_gbps, f.h2d_registered_gbps),
            f.shm_put_gbps >= bar);
  // Infer time is the server's, from receipt to response, as Triton's statistics extension counts
  // a request's duration: a client's wall time adds a gRPC round trip, and that alone
  // (Health/Check's p50, printed beside) is above 100 us on the GPU hosts.
  AddTarget(rep, "OIP: 1 GiB row_mean via CUDA shm, server infer - kernel <= 100 us",
            absl::StrFormat("%.1f us (client wall - kernel %.1f - %.1f = %.1f us; Health/Check p50 %.1f us)",
                            f.cuda_server_over_kernel_us, f.cuda_infer_us, f.cuda_kernel_us,
                            f.cuda_infer_us - f.cuda_kernel_us, f.health_p50_us),
            f.cuda_server_over_kernel_us <= 100);
  AddTarget(rep, "OIP: raw_input_contents >= 1.5 GB/s (opserve client)",
            absl::StrFormat("%.2f GB/s (%llu MiB; generated stub %.2f)", f.raw_client_gbps,
                            static_cast<unsigned long long>(f.raw_bytes >> 20), f.raw_gbps),
            f.raw_client_gbps >= 1.5);
  AddTarget(rep, "OIP: 10x2048 ModelInfer p50 <= 1.2x Execute p50",
            absl::StrFormat("%.1f vs 1.2 x %.1f us", f.infer_p50_us, f.execute_p50_us),
            f.infer_p50_us <= 1.2 * f.execute_p50_us);
}

}  // namespace opserve::bench
