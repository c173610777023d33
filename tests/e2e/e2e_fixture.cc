#include "tests/e2e/e2e_fixture.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace opserve::e2e {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

std::string OpserveTest::Device() {
  const char* d = std::getenv("OPSERVE_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? d : "cpu";
}

void OpserveTest::SetUp() { Restart(ExtraFlags()); }

void OpserveTest::Restart(const std::vector<std::string>& extra) {
  stub_.reset();
  client_.reset();
  server_.reset();
  std::vector<std::string> flags = {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1",
                                    "--device=" + Device()};
  // Every server of a capped GPU-suite run gets the cap; a test's own flags come after it, so
  // one that sets the flag itself wins.
  if (const char* cap = std::getenv("OPSERVE_TEST_MAX_COMPUTE_CAPABILITY"); cap && *cap) {
    flags.push_back(std::string("--max_compute_capability=") + cap);
  }
  flags.insert(flags.end(), extra.begin(), extra.end());
  auto server = ServerProcess::Start(OpserveBinary(), flags);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);

  client::ClientOptions options;
  options.target = server_->target();
  options.timeout = absl::Seconds(60);  // no call in these tests may hang the suite
  auto c = client::Client::Connect(options);
  ASSERT_TRUE(c.ok()) << c.status();
  client_ = *std::move(c);
  stub_ = v1::OpServe::NewStub(
      grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
}

void OpserveTest::TearDown() {
  if (server_) EXPECT_TRUE(NoSanitizerReport(server_->Output()));
  if (HasFailure() && server_) {
    std::cerr << "---- opserve output ----\n" << server_->Output() << "------------------------\n";
  }
  stub_.reset();
  client_.reset();
  server_.reset();
}

AssertionResult OpserveTest::Serving() {
  absl::StatusOr<bool> serving = client_->HealthServing({absl::Seconds(10)});
  if (!serving.ok()) return AssertionFailure() << "health check failed: " << serving.status();
  if (!*serving) return AssertionFailure() << "health is not SERVING";
  if (!server_->Alive()) return AssertionFailure() << "the server process exited";
  return AssertionSuccess();
}

AssertionResult NoSanitizerReport(const std::string& server_output) {
  for (const char* report : {"runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                             "WARNING: ThreadSanitizer"}) {
    if (server_output.find(report) != std::string::npos) {
      return AssertionFailure() << "the server reported: " << report;
    }
  }
  return AssertionSuccess();
}

BackgroundExecute::BackgroundExecute(v1::OpServe::Stub& stub, v1::ExecuteRequest request)
    : request_(std::move(request)), thread_([this, &stub] {
        status_ = stub.Execute(&context_, request_, &response_);
        done_ = true;
      }) {}

BackgroundExecute::~BackgroundExecute() {
  if (!thread_.joinable()) return;
  if (!done()) context_.TryCancel();
  thread_.join();
}

const grpc::Status& BackgroundExecute::Wait() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

RawResult RawCall(const std::string& target, const std::string& method,
                  const std::vector<std::string>& messages,
                  const std::multimap<std::string, std::string>& metadata) {
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  for (const auto& [key, value] : metadata) ctx.AddMetadata(key, value);
  grpc::CompletionQueue cq;
  // Each operation waits for its own completion: one at a time on this queue.
  auto wait = [&cq] {
    void* tag;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  RawResult result;
  {
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub.PrepareCall(&ctx, "/opserve.v1.OpServe/" + method, &cq);
    call->StartCall(nullptr);
    bool open = wait();
    for (const std::string& m : messages) {
      if (!open) break;
      grpc::Slice slice(m);
      call->Write(grpc::ByteBuffer(&slice, 1), nullptr);
      open = wait();  // false once the server has finished the call
    }
    if (open) {
      call->WritesDone(nullptr);
      wait();
    }
    grpc::ByteBuffer response;
    for (;;) {
      call->Read(&response, nullptr);
      if (!wait()) break;
      ++result.responses;
    }
    call->Finish(&result.status, nullptr);
    wait();
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

client::HostTensor RandomTensor(v1::DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  client::HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(*client::ByteSize(dtype, t.shape));
  size_t i = 0;
  for (; i + 8 <= t.data.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(&t.data[i], &r, 8);
  }
  for (; i < t.data.size(); ++i) t.data[i] = static_cast<char>(rng());
  return t;
}

client::HostTensor RandomFloats(std::vector<int64_t> shape, std::mt19937_64& rng) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return F32(std::move(shape), v);
}

client::HostTensor F32(std::vector<int64_t> shape, const std::vector<float>& values) {
  client::HostTensor t;
  t.dtype = v1::FLOAT32;
  t.shape = std::move(shape);
  t.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return t;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

StoreSnapshot Snapshot(client::Client& c) {
  StoreSnapshot s;
  auto list = c.ListTensors();
  EXPECT_TRUE(list.ok()) << list.status();
  if (!list.ok()) return s;
  for (const v1::TensorInfo& info : *list) {
    s.info[info.name()] = info.SerializeAsString();
    auto t = c.GetTensor(info.name());
    EXPECT_TRUE(t.ok()) << info.name() << ": " << t.status();
    if (t.ok()) s.bytes[info.name()] = t->data;
  }
  return s;
}

AssertionResult SameStore(const StoreSnapshot& before, const StoreSnapshot& after) {
  for (const auto& [name, info] : before.info) {
    auto it = after.info.find(name);
    if (it == after.info.end()) return AssertionFailure() << "tensor '" << name << "' is gone";
    if (it->second != info) return AssertionFailure() << "tensor '" << name << "' changed its info";
    if (after.bytes.at(name) != before.bytes.at(name)) {
      return AssertionFailure() << "tensor '" << name << "' changed its bytes";
    }
  }
  for (const auto& [name, info] : after.info) {
    if (before.info.count(name) == 0) {
      return AssertionFailure() << "tensor '" << name << "' appeared";
    }
  }
  return AssertionSuccess();
}

absl::StatusOr<std::vector<float>> StoreExactMatmulInputs(client::Client& c, const std::string& a,
                                                          const std::string& b, int64_t n,
                                                          std::mt19937_64& rng) {
  std::vector<float> ones(n * n, 1.f), values(n * n);
  std::uniform_int_distribution<int> d(-8, 8);
  for (float& x : values) x = static_cast<float>(d(rng));
  std::vector<float> col_sums(n, 0.f);
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t j = 0; j < n; ++j) col_sums[j] += values[p * n + j];
  }
  if (auto s = c.PutTensor(a, F32({n, n}, ones), /*overwrite=*/true).status(); !s.ok()) return s;
  if (auto s = c.PutTensor(b, F32({n, n}, values), /*overwrite=*/true).status(); !s.ok()) return s;
  return col_sums;
}

AssertionResult IsExactMatmul(const v1::ExecuteResponse& resp, int64_t n,
                              const std::vector<float>& col_sums) {
  if (resp.outputs_size() != 1) {
    return AssertionFailure() << resp.outputs_size() << " outputs, expected one";
  }
  const std::vector<float> c = Floats(resp.outputs(0).tensor().data());
  if (c.size() != static_cast<size_t>(n * n)) {
    return AssertionFailure() << c.size() << " values, expected " << n * n;
  }
  for (int64_t i = 0; i < n * n; ++i) {
    if (c[i] != col_sums[i % n]) {
      return AssertionFailure() << "C[" << i / n << "][" << i % n << "] = " << c[i]
                                << ", expected " << col_sums[i % n];
    }
  }
  return AssertionSuccess();
}

}  // namespace opserve::e2e
