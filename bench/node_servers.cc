// The node section's servers and what passes between them and the bench: starting a server
// (the whole node, or one GPU through a script of its own), streaming generated tensors in and
// reading them back through the generated stub, and the requests the sections send.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench::node_bench {
namespace {

// Upload chunks as the client library sends them: under gRPC's default 4 MiB receive limit.
constexpr uint64_t kChunkBytes = client::kDefaultChunkBytes;
constexpr uint32_t kReadChunkBytes = 4u << 20;
// A channel of its own per client group: gRPC would otherwise share one connection.
constexpr char kOwnSubchannelPool[] = "grpc.use_local_subchannel_pool";

}  // namespace

// ---- Transfers. ----

PutOutcome PutGen(v1::OpServe::Stub& stub, const std::string& name, const Gen& g,
                  const std::string& device, bool shard, bool row_sums, int threads) {
  PutOutcome out;
  if (row_sums) {
    out.row_sum.assign(g.rows, 0);
    out.row_abs.assign(g.rows, 0);
  }
  const uint64_t chunk_elems = kChunkBytes / g.ElemBytes();
  const uint64_t chunks = (g.Elems() + chunk_elems - 1) / chunk_elems;
  threads = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(threads, chunks)));
  const size_t slots = 2 * static_cast<size_t>(threads);
  struct Slot {
    int64_t chunk = -1;
    std::string bytes;
    std::vector<RowPart> parts;
  };
  std::vector<Slot> ring(slots);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t consumed = 0;
  bool stop = false;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (uint64_t c = t; c < chunks; c += threads) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || c < consumed + slots; });
          if (stop) return;
        }
        std::vector<RowPart> parts;
        const uint64_t e0 = c * chunk_elems, e1 = std::min(g.Elems(), e0 + chunk_elems);
        std::string bytes = Draw(g, e0, e1, row_sums ? &parts : nullptr);
        std::lock_guard<std::mutex> lock(mu);
        Slot& s = ring[c % slots];
        s.chunk = static_cast<int64_t>(c);
        s.bytes = std::move(bytes);
        s.parts = std::move(parts);
        cv.notify_all();
      }
    });
  }
  grpc::ClientContext context;
  v1::PutTensorResponse response;
  const auto t0 = Clock::now();
  std::unique_ptr<grpc::ClientWriter<v1::PutTensorRequest>> writer =
      stub.PutTensor(&context, &response);
  v1::PutTensorRequest header;
  v1::PutTensorHeader* h = header.mutable_header();
  h->set_name(name);
  h->set_dtype(g.dtype);
  h->add_shape(g.rows);
  h->add_shape(g.cols);
  h->set_overwrite(true);
  h->set_device(device);
  h->set_shard(shard);
  // A failed write means the server ended the call (a refusal): Finish says why.
  bool sent = writer->Write(header);
  for (uint64_t c = 0; sent && c < chunks; ++c) {
    v1::PutTensorRequest msg;
    std::vector<RowPart> parts;
    {
      std::unique_lock<std::mutex> lock(mu);
      Slot& s = ring[c % slots];
      cv.wait(lock, [&] { return s.chunk == static_cast<int64_t>(c); });
      msg.set_chunk(std::move(s.bytes));
      parts = std::move(s.parts);
      s.chunk = -1;
      consumed = c + 1;
      cv.notify_all();
    }
    for (const RowPart& p : parts) {
      out.row_sum[p.row] += p.sum;
      out.row_abs[p.row] += p.abs;
    }
    sent = writer->Write(msg);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  }
  for (std::thread& t : pool) t.join();
  if (sent) writer->WritesDone();
  out.status = writer->Finish();
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.info = response.info();
  return out;
}

// GetTensor `name` in chunks handed to `on_chunk(byte offset, bytes)` as they arrive.
grpc::Status ReadTensor(v1::OpServe::Stub& stub, const std::string& name,
                        const std::function<void(uint64_t, const std::string&)>& on_chunk,
                        v1::TensorInfo* info, uint64_t* bytes) {
  grpc::ClientContext context;
  v1::GetTensorRequest req;
  req.set_name(name);
  req.set_chunk_bytes(kReadChunkBytes);
  std::unique_ptr<grpc::ClientReader<v1::GetTensorResponse>> reader = stub.GetTensor(&context, req);
  v1::GetTensorResponse msg;
  *bytes = 0;
  while (reader->Read(&msg)) {
    if (msg.has_info()) {
      *info = msg.info();
      continue;
    }
    on_chunk(*bytes, msg.chunk());
    *bytes += msg.chunk().size();
  }
  return reader->Finish();
}

// ---- Requests. ----

v1::ExecuteRequest TinyRowMean(const Gen& g) {
  v1::ExecuteRequest req;
  v1::Node* node = req.add_nodes();
  node->set_id("m");
  node->set_op("row_mean");
  node->set_algorithm("auto");
  node->add_inputs()->set_inline_name("x");
  v1::Tensor& t = (*req.mutable_inline_tensors())["x"];
  t.set_dtype(g.dtype);
  t.add_shape(g.rows);
  t.add_shape(g.cols);
  t.set_data(Draw(g, 0, g.Elems(), nullptr));
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("m");
  out->set_return_inline(true);
  return req;
}

v1::ExecuteRequest MatmulStored(const std::string& a, const std::string& b,
                                const std::string& store_as) {
  v1::ExecuteRequest req;
  v1::Node* node = req.add_nodes();
  node->set_id("c");
  node->set_op("matmul");
  node->set_algorithm("auto");
  node->add_inputs()->set_stored(a);
  node->add_inputs()->set_stored(b);
  v1::OutputSpec* out = req.add_outputs();
  out->set_node("c");
  out->set_store_as(store_as);
  out->set_overwrite(true);
  return req;
}

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}
std::string StatusText(const grpc::Status& s) {
  return StatusText(client::ToAbslStatus(s));
}

// ---- Servers. ----

Launcher::~Launcher() {
  for (const std::string& f : files_) unlink(f.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
}

std::string Launcher::OneGpu(int i) {
  if (dir_.empty()) {
    char tmpl[] = "/tmp/opserve-node-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Die("mkdtemp for the one-GPU servers' scripts failed");
    dir_ = tmpl;
  }
  std::string visible = std::to_string(i);
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && *v != '\0') {
    std::vector<std::string> list = absl::StrSplit(v, ',');
    if (i < static_cast<int>(list.size())) visible = list[i];
  }
  const std::string path = absl::StrCat(dir_, "/gpu", i, ".sh");
  std::string quoted = "'";
  for (char ch : bin_) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  quoted += "'";
  std::ofstream f(path);
  f << "#!/bin/sh\nexport NCCL_NVLS_ENABLE=0\nexport CUDA_VISIBLE_DEVICES='" << visible
    << "'\nexec " << quoted << " \"$@\"\n";
  f.close();
  if (!f || chmod(path.c_str(), 0700) != 0) Die(absl::StrCat("cannot write ", path));
  files_.push_back(path);
  return path;
}

ServerFlags ProbeServerFlags(const std::string& bin) {
  ServerFlags f;
  std::string text;
  if (FILE* p = popen(absl::StrCat("'", bin, "' --helpfull 2>&1").c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
    pclose(p);
  }
  // The per-device flag of the multi-device contract, or the older name of the same budget.
  if (!absl::StrContains(text, "--memory_budget ") &&
      !absl::StrContains(text, "--memory_budget (") &&
      absl::StrContains(text, "--memory_budget_bytes")) {
    f.budget = "--memory_budget_bytes";
  }
  f.fail_device = absl::StrContains(text, "test_fail_device");
  return f;
}

std::string NodeServer::Open(const std::string& bin, const std::vector<std::string>& args,
                             int n_groups) {
  if (std::string err = session.Open(bin, args); !err.empty()) {
    absl::StripTrailingAsciiWhitespace(&err);  // the server's own last line
    return err;
  }
  for (int i = 0; i < 200; ++i) {
    auto h = session.client->HealthServing();
    if (h.ok() && *h) break;
    if (i == 199) return "the server never reported SERVING";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stub = v1::OpServe::NewStub(session.client->channel());
  auto ops = session.client->ListOps();
  if (!ops.ok()) return absl::StrCat("ListOps: ", StatusText(ops.status()));
  for (const v1::DeviceInfo& d : ops->devices()) {
    devices.push_back(d.name());
    infos.push_back(d);
  }
  if (devices.empty()) {
    return "ListOps lists no devices: this server predates serving several";
  }
  for (int g = 0; g < n_groups; ++g) {
    client::ClientOptions co;
    co.target = absl::StrCat("127.0.0.1:", session.server.port());
    co.channel_args[kOwnSubchannelPool] = 1;
    auto c = client::Client::Connect(co);
    if (!c.ok()) return StatusText(c.status());
    groups.push_back(*std::move(c));
  }
  return "";
}

}  // namespace opserve::bench::node_bench
