// Measures PutTensor and GetTensor throughput over loopback against the in-process fake server,
// across chunk sizes and HTTP/2 settings; the numbers behind client/TUNING.md.
//
//   transfer_bench [--bytes=N] [--repeat=R] [--chunks=a,b,c] [--configs=x,y]
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/opserve_client.h"
#include "fake_opserve.h"
#include "grpcpp/create_channel.h"

namespace {

using opserve::client::Client;
using opserve::client::ClientOptions;
using opserve::client::HostTensor;

struct Config {
  std::string name;
  bool reuse_buffers;                      // the fake server uploads into warm, reused memory
  std::map<std::string, int> server_args;  // govern uploads: the server is the receiver
  std::map<std::string, int> client_args;  // govern downloads
};

std::vector<Config> Configs() {
  const int kWindow = 64 << 20;
  return {
      // gRPC's defaults: 64 KiB initial stream window grown by the BDP probe.
      {"grpc_default", false, {}, {{"grpc.http2.lookahead_bytes", 65535}}},
      // The client's shipped setting (64 MiB download window); the server on defaults.
      {"client_window", false, {}, {}},
      // Both receivers with a 64 MiB window: what a tuned server adds for uploads.
      {"both_windows", false, {{"grpc.http2.lookahead_bytes", kWindow}}, {}},
      // The same with a server that reuses upload buffers (a pool, like the CUDA backend's).
      {"both_windows_warm", true, {{"grpc.http2.lookahead_bytes", kWindow}}, {}},
      {"windows_no_bdp",
       false,
       {{"grpc.http2.lookahead_bytes", kWindow}, {"grpc.http2.bdp_probe", 0}},
       {{"grpc.http2.bdp_probe", 0}}},
      {"windows_16m_frames",
       false,
       {{"grpc.http2.lookahead_bytes", kWindow}, {"grpc.http2.max_frame_size", 16 << 20}},
       {{"grpc.http2.max_frame_size", 16 << 20}}},
      {"windows_write_buffer",
       false,
       {{"grpc.http2.lookahead_bytes", kWindow}, {"grpc.http2.write_buffer_size", 8 << 20}},
       {{"grpc.http2.write_buffer_size", 8 << 20}}},
  };
}

double Gbps(uint64_t bytes, absl::Duration d) { return bytes / absl::ToDoubleSeconds(d) / 1e9; }

// The baseline: the generated stub's ClientWriter, which copies each chunk twice (into the
// message, then into gRPC's buffer) where the library copies once.
absl::Duration TypedPut(const std::string& target, const HostTensor& tensor, int64_t chunk,
                        const std::map<std::string, int>& client_args) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  for (const auto& [key, value] : client_args) args.SetInt(key, value);
  auto stub = opserve::v1::OpServe::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  opserve::v1::PutTensorResponse response;
  const absl::Time start = absl::Now();
  auto writer = stub->PutTensor(&context, &response);
  opserve::v1::PutTensorRequest request;
  request.mutable_header()->set_name("typed");
  request.mutable_header()->set_dtype(tensor.dtype);
  request.mutable_header()->add_shape(tensor.shape[0]);
  request.mutable_header()->set_overwrite(true);
  bool ok = writer->Write(request);
  for (size_t offset = 0; ok && offset < tensor.data.size(); offset += chunk) {
    request.set_chunk(tensor.data.data() + offset,
                      std::min<size_t>(chunk, tensor.data.size() - offset));
    ok = writer->Write(request);
  }
  writer->WritesDone();
  if (!writer->Finish().ok()) return absl::InfiniteDuration();
  return absl::Now() - start;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 1ull << 30;
  int repeat = 3;
  std::vector<int64_t> chunks = {64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20};
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    if (kv.size() != 2) continue;
    if (kv[0] == "--bytes") (void)absl::SimpleAtoi(kv[1], &bytes);
    if (kv[0] == "--repeat") (void)absl::SimpleAtoi(kv[1], &repeat);
    if (kv[0] == "--configs") only = absl::StrSplit(kv[1], ',');
    if (kv[0] == "--chunks") {
      chunks.clear();
      for (absl::string_view c : absl::StrSplit(kv[1], ',')) {
        int64_t value = 0;
        if (absl::SimpleAtoi(c, &value)) chunks.push_back(value);
      }
    }
  }

  HostTensor tensor;
  tensor.dtype = opserve::v1::FLOAT32;
  tensor.shape = {static_cast<int64_t>(bytes / 4)};
  tensor.data.resize(bytes / 4 * 4);
  std::mt19937_64 random(7);
  for (size_t i = 0; i + 8 <= tensor.data.size(); i += 8) {
    const uint64_t bits = random();
    std::memcpy(&tensor.data[i], &bits, 8);
  }

  std::cout << absl::StrFormat("%-22s %10s %12s %12s %16s\n", "config", "chunk", "put GB/s",
                               "get GB/s", "typed put GB/s");
  for (const Config& config : Configs()) {
    if (!only.empty() && std::find(only.begin(), only.end(), config.name) == only.end()) continue;
    opserve::testing::FakeServerOptions server_options;
    server_options.channel_args = config.server_args;
    server_options.reuse_buffers = config.reuse_buffers;
    auto server = opserve::testing::FakeServer::Start(server_options);
    if (!server) return 1;
    for (int64_t chunk : chunks) {
      ClientOptions options;
      options.target = server->target();
      options.chunk_bytes = chunk;
      options.channel_args = config.client_args;
      auto client = Client::Connect(options);
      if (!client.ok()) return 1;
      double best_put = 0, best_get = 0, best_typed = 0;
      for (int r = 0; r < repeat; ++r) {
        absl::Time start = absl::Now();
        auto info = (*client)->PutTensor("bench", tensor, /*overwrite=*/true);
        const absl::Duration put = absl::Now() - start;
        start = absl::Now();
        auto back = (*client)->GetTensor("bench");
        const absl::Duration get = absl::Now() - start;
        if (!info.ok() || !back.ok() || back->data.size() != tensor.data.size()) {
          std::cerr << "failed: " << info.status() << " " << back.status() << "\n";
          return 1;
        }
        best_put = std::max(best_put, Gbps(bytes, put));
        best_get = std::max(best_get, Gbps(bytes, get));
        best_typed = std::max(
            best_typed, Gbps(bytes, TypedPut(server->target(), tensor, chunk, config.client_args)));
      }
      std::cout << absl::StrFormat("%-22s %10d %12.2f %12.2f %16.2f\n", config.name, chunk,
                                   best_put, best_get, best_typed);
    }
  }
  return 0;
}
