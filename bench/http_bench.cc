#include "bench/http_bench.h"

#include <civetweb.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
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
namespace {

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

// One keep-alive connection through civetweb's client: civetweb writes nothing of the request
// for us but the bytes we give it, and parses the response (status, headers, length).
class HttpClient {
 public:
  ~HttpClient() { Close(); }

  std::string Connect(int port) {
    Close();
    port_ = port;
    char error[256] = "";
    conn_ = mg_connect_client("127.0.0.1", port, /*use_ssl=*/0, error, sizeof(error));
    return conn_ != nullptr ? "" : absl::StrCat("mg_connect_client: ", error);
  }

  struct Answer {
    int status = 0;
    std::string body;
    int64_t header_length = -1;  // Inference-Header-Content-Length, -1 without
  };

  static constexpr uint64_t kSmallBody = 64 << 10;

  // The request's bytes up to its body: its line and headers, Content-Length among them.
  static std::string Head(const char* method, const std::string& path, uint64_t length,
                          const std::string& headers) {
    return absl::StrFormat("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %llu\r\n%s\r\n",
                           method, path, static_cast<unsigned long long>(length), headers);
  }

  // `method path` with `body` (its pieces sent in order, none copied past kSmallBody) and
  // `headers`.
  std::string Call(const char* method, const std::string& path,
                   const std::vector<std::string_view>& body, const std::string& headers,
                   Answer* answer) {
    uint64_t length = 0;
    for (std::string_view b : body) length += b.size();
    std::string head = Head(method, path, length, headers);
    // A small body leaves in the headers' send: sent apart, its segment waits (Nagle's rule,
    // this socket has no TCP_NODELAY) for the server's delayed ACK of the headers, 40 ms.
    std::vector<std::string_view> pieces = body;
    if (length <= kSmallBody) {
      for (std::string_view b : body) head.append(b);
      pieces.clear();
    }
    const std::string what = absl::StrCat(method, " ", path);
    if (std::string err = Send(head, what); !err.empty()) return err;
    for (std::string_view b : pieces) {
      if (std::string err = Send(b, what); !err.empty()) return err;
    }
    return Receive(what, answer);
  }

  // A whole request, built once by the caller (Head and its body), in one write: what the
  // server receives is then the same bytes at the same pace whatever their size.
  std::string Call(std::string_view request, const std::string& what, Answer* answer) {
    if (std::string err = Send(request, what); !err.empty()) return err;
    return Receive(what, answer);
  }

 private:
  std::string Send(std::string_view bytes, const std::string& what) {
    // mg_write takes a size_t but answers in an int: pieces under 1 GiB.
    for (size_t at = 0; at < bytes.size(); at += 1u << 30) {
      if (mg_write(conn_, bytes.data() + at, std::min<size_t>(bytes.size() - at, 1u << 30)) <= 0) {
        return absl::StrCat(what, ": the connection closed while sending");
      }
    }
    return "";
  }

  std::string Receive(const std::string& what, Answer* answer) {
    char error[256] = "";
    if (mg_get_response(conn_, error, sizeof(error), /*timeout_ms=*/600000) < 0) {
      return absl::StrCat(what, ": ", error);
    }
    const mg_response_info* info = mg_get_response_info(conn_);
    answer->status = info->status_code;
    const char* h = mg_get_header(conn_, "Inference-Header-Content-Length");
    answer->header_length = h != nullptr ? std::atoll(h) : -1;
    answer->body.resize(info->content_length > 0 ? info->content_length : 0);
    uint64_t got = 0;
    while (got < answer->body.size()) {
      const int n = mg_read(conn_, answer->body.data() + got, answer->body.size() - got);
      if (n <= 0) return absl::StrCat(what, ": the response ended early");
      got += n;
    }
    if (answer->status != 200) {
      return absl::StrCat(what, ": HTTP ", answer->status, " ", answer->body);
    }
    return "";
  }

  void Close() {
    if (conn_ != nullptr) mg_close_connection(conn_);
    conn_ = nullptr;
  }
  mg_connection* conn_ = nullptr;
  int port_ = 0;
};

// A row_mean infer request's JSON: its input `x` as `data` (JSON values), as binary data, or
// in a region; its output y as binary data when `binary_out`.
std::string InferJson(int64_t rows, int64_t cols, const float* data, uint64_t binary_size,
                      const std::string& region, uint64_t region_bytes, bool binary_out) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  w.Key("inputs");
  w.StartArray();
  w.StartObject();
  w.Key("name");
  w.String("x");
  w.Key("datatype");
  w.String("FP32");
  w.Key("shape");
  w.StartArray();
  w.Int64(rows);
  w.Int64(cols);
  w.EndArray();
  if (data != nullptr) {
    w.Key("data");
    w.StartArray();
    for (int64_t i = 0; i < rows * cols; ++i) w.Double(data[i]);
    w.EndArray();
  } else {
    w.Key("parameters");
    w.StartObject();
    if (!region.empty()) {
      w.Key("shared_memory_region");
      w.String(region.c_str());
      w.Key("shared_memory_byte_size");
      w.Uint64(region_bytes);
    } else {
      w.Key("binary_data_size");
      w.Uint64(binary_size);
    }
    w.EndObject();
  }
  w.EndObject();
  w.EndArray();
  w.Key("outputs");
  w.StartArray();
  w.StartObject();
  w.Key("name");
  w.String("y");
  w.Key("parameters");
  w.StartObject();
  w.Key("binary_data");
  w.Bool(binary_out);
  w.EndObject();
  w.EndObject();
  w.EndArray();
  w.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

// The answer holds `rows` outputs: as JSON data, or as binary data after the JSON.
std::string CheckRows(const HttpClient::Answer& a, int64_t rows) {
  const size_t json_bytes = a.header_length >= 0 ? a.header_length : a.body.size();
  rapidjson::Document doc;
  doc.Parse(a.body.data(), json_bytes);
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("outputs")) {
    return "the infer answer is not the protocol's JSON";
  }
  const rapidjson::Value& y = doc["outputs"][0];
  if (y.HasMember("data")) {
    return y["data"].Size() == static_cast<size_t>(rows) ? "" : "the output has the wrong length";
  }
  if (a.header_length < 0 || a.body.size() - json_bytes != static_cast<size_t>(rows) * 4) {
    return "the binary output has the wrong length";
  }
  return "";
}

std::string Run(const HttpOptions& opt, HttpFigures* f) {
  const int64_t cols = 16384;
  const int64_t rows = std::max<int64_t>(8, (opt.shm_mib << 20) / (cols * 4));
  f->shm_bytes = static_cast<uint64_t>(rows * cols) * 4;
  const int64_t binary_rows = rows / 8;
  f->binary_bytes = static_cast<uint64_t>(binary_rows * cols) * 4;

  Session session;
  std::vector<std::string> args = opt.server_args;
  args.push_back("--http_port=0");
  if (std::string err = session.Open(opt.opserve_bin, args); !err.empty()) return err;
  if (session.server.http_port() <= 0) return "the server printed no HTTP port";
  HttpClient http;
  if (std::string err = http.Connect(session.server.http_port()); !err.empty()) return err;
  auto stub = inference::GRPCInferenceService::NewStub(session.raw_channel);

  // The client's POSIX shm object, filled once; its first bytes feed the other requests too.
  const std::string key = absl::StrCat("/opserve-http-bench-", getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, f->shm_bytes) != 0) return "cannot create the shm object";
  char* host =
      static_cast<char*>(mmap(nullptr, f->shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
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
  } cleanup{key, host, f->shm_bytes};
  const std::string x = RandomFloats(f->shm_bytes / 4);
  std::memcpy(host, x.data(), f->shm_bytes);

  {  // (a) 10x2048: HTTP JSON and gRPC ModelInfer, interleaved. The HTTP request (headers and
     // JSON body) is built once and leaves in one write, as the protobuf request is built once:
     // each side's client-side encoding stays out of the figure.
    const auto* small = reinterpret_cast<const float*>(host);
    const std::string body = InferJson(10, 2048, small, 0, "", 0, /*binary_out=*/false);
    const std::string path = "/v2/models/row_mean/infer";
    const std::string request = HttpClient::Head("POST", path, body.size(), "") + body;
    inference::ModelInferRequest req;
    req.set_model_name("row_mean");
    auto* in = req.add_inputs();
    in->set_name("x");
    in->set_datatype("FP32");
    in->add_shape(10);
    in->add_shape(2048);
    req.add_raw_input_contents(host, 10 * 2048 * 4);
    std::vector<double> json_us, grpc_us;
    for (int i = 0; i < 200 + opt.small_requests; ++i) {
      HttpClient::Answer a;
      auto t0 = Clock::now();
      if (std::string err = http.Call(request, path, &a); !err.empty()) return err;
      auto t1 = Clock::now();
      grpc::ClientContext ctx;
      inference::ModelInferResponse resp;
      grpc::Status s = stub->ModelInfer(&ctx, req, &resp);
      auto t2 = Clock::now();
      if (!s.ok()) return absl::StrCat("ModelInfer 10x2048: ", s.error_message());
      if (i == 0) {
        if (std::string err = CheckRows(a, 10); !err.empty()) return err;
      }
      if (i < 200) continue;  // warm
      json_us.push_back(Us(t1 - t0));
      grpc_us.push_back(Us(t2 - t1));
    }
    f->json_p50_us = Median(json_us);
    f->grpc_p50_us = Median(grpc_us);
  }

  {  // (b) binary tensor data: the JSON header, then the input's bytes; the output binary too.
    const std::string header = InferJson(binary_rows, cols, nullptr, f->binary_bytes, "", 0, true);
    const std::string headers =
        absl::StrCat("Inference-Header-Content-Length: ", header.size(), "\r\n");
    const std::string_view raw(host, f->binary_bytes);
    std::vector<double> us;
    for (int i = 0; i <= opt.reps; ++i) {
      HttpClient::Answer a;
      const auto t0 = Clock::now();
      if (std::string err =
              http.Call("POST", "/v2/models/row_mean/infer", {header, raw}, headers, &a);
          !err.empty()) {
        return err;
      }
      const double wall = Us(Clock::now() - t0);
      if (std::string err = CheckRows(a, binary_rows); !err.empty()) return err;
      if (i > 0) us.push_back(wall);
    }
    f->binary_gbps = f->binary_bytes / (Median(us) * 1e-6) / 1e9;
  }

  {  // (c) system shared memory, registered over HTTP.
    HttpClient::Answer a;
    const std::string reg =
        absl::StrFormat(R"({"key": "%s", "offset": 0, "byte_size": %d})", key, f->shm_bytes);
    if (std::string err =
            http.Call("POST", "/v2/systemsharedmemory/region/bench/register", {reg}, "", &a);
        !err.empty()) {
      return err;
    }
    const std::string body = InferJson(rows, cols, nullptr, 0, "bench", f->shm_bytes, false);
    std::vector<double> us;
    for (int i = 0; i <= opt.reps; ++i) {
      const auto t0 = Clock::now();
      if (std::string err = http.Call("POST", "/v2/models/row_mean/infer", {body}, "", &a);
          !err.empty()) {
        return err;
      }
      const double wall = Us(Clock::now() - t0);
      if (std::string err = CheckRows(a, rows); !err.empty()) return err;
      if (i > 0) us.push_back(wall);
    }
    f->shm_gbps = f->shm_bytes / (Median(us) * 1e-6) / 1e9;
    (void)http.Call("POST", "/v2/systemsharedmemory/region/bench/unregister", {}, "", &a);
  }

  if (opt.gpu) {  // the anchor: this process's own registration of the same pages
    void* dev = nullptr;
    if (cudaMalloc(&dev, f->shm_bytes) != cudaSuccess) return "cudaMalloc of the anchor's buffer";
    cudaHostRegister(host, f->shm_bytes, cudaHostRegisterDefault);
    f->h2d_registered_gbps = RegisteredH2D(host, dev, f->shm_bytes, opt.reps);
    cudaHostUnregister(host);
    cudaFree(dev);
  }
  return "";
}

}  // namespace

HttpFigures RunHttpBench(const HttpOptions& options) {
  HttpFigures f;
  mg_init_library(0);
  f.error = Run(options, &f);
  f.ran = f.error.empty();
  return f;
}

void PrintHttp(const HttpFigures& f) {
  if (!f.ran) {
    std::printf("\nOpen Inference Protocol over HTTP: not measured: %s\n", f.error.c_str());
    return;
  }
  std::printf("\nOpen Inference Protocol over HTTP/REST, row_mean FP32 (medians):\n");
  std::printf("  10x2048: HTTP JSON p50 %.1f us, gRPC ModelInfer p50 %.1f us\n", f.json_p50_us,
              f.grpc_p50_us);
  std::printf("  %llu MiB binary tensor data  %8.2f GB/s\n",
              static_cast<unsigned long long>(f.binary_bytes >> 20), f.binary_gbps);
  std::printf("  %llu MiB system shared memory  %8.2f GB/s (registered host->device %.1f GB/s)\n",
              static_cast<unsigned long long>(f.shm_bytes >> 20), f.shm_gbps,
              f.h2d_registered_gbps);
}

void AddHttpTargets(const HttpFigures& f, Report& rep) {
  if (!f.ran) return;
  AddTarget(rep, "HTTP: 10x2048 row_mean JSON p50 <= 1.5x gRPC ModelInfer p50",
            absl::StrFormat("%.1f vs 1.5 x %.1f us", f.json_p50_us, f.grpc_p50_us),
            f.json_p50_us <= 1.5 * f.grpc_p50_us);
  AddTarget(rep, "HTTP: binary tensor data >= 1.5 GB/s",
            absl::StrFormat("%.2f GB/s (%llu MiB)", f.binary_gbps,
                            static_cast<unsigned long long>(f.binary_bytes >> 20)),
            f.binary_gbps >= 1.5);
  if (f.h2d_registered_gbps > 0) {
    AddTarget(
        rep, "HTTP: row_mean via system shm >= 0.7x registered H2D copy",
        absl::StrFormat("%.1f GB/s vs 0.7 x %.1f (%llu MiB)", f.shm_gbps, f.h2d_registered_gbps,
                        static_cast<unsigned long long>(f.shm_bytes >> 20)),
        f.shm_gbps >= 0.7 * f.h2d_registered_gbps);
  }
}

}  // namespace opserve::bench
