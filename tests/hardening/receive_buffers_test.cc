// The blocks ModelInfer's large raw_input_contents and Execute's large inline tensors are received
// into (server/rpc/receive_pool.h), seen from outside through opserve_receive_buffer_bytes: a
// large input lands in one, the next request of that size reuses it instead of mapping more, a
// refused request gives its block back too, and a small input never takes one.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "inference/grpc_service.grpc.pb.h"
#include "tests/hardening/hardening_support.h"

namespace opserve::hardening {
namespace {

class ReceiveBuffersTest : public HardeningTest {
 protected:
  void SetUp() override {
    HardeningTest::SetUp();
    if (HasFatalFailure()) return;
    stub_ = inference::GRPCInferenceService::NewStub(
        grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  }

  double Buffers(const char* state) {
    absl::StatusOr<double> v =
        Metric("opserve_receive_buffer_bytes", {absl::StrCat("state=\"", state, "\"")});
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : -1;
  }
  // The block goes back once the call is done on the server, which may be just after the client
  // has its answer.
  double IdleOnceNoneInUse() {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Buffers("in_use") != 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(Buffers("in_use"), 0);
    return Buffers("idle");
  }

  // row_mean of a rows x 1024 FP32 input of random values sent in raw_input_contents; checks
  // the answer against the mean computed here when the call succeeds.
  grpc::Status RowMean(int64_t rows, bool wrong_shape = false) {
    std::vector<float> x(rows * 1024);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& v : x) v = u(rng_);
    inference::ModelInferRequest req;
    req.set_model_name("row_mean");
    auto* in = req.add_inputs();
    in->set_name("x");
    in->set_datatype("FP32");
    in->add_shape(wrong_shape ? rows + 1 : rows);
    in->add_shape(1024);
    req.add_raw_input_contents(std::string(reinterpret_cast<const char*>(x.data()), x.size() * 4));
    grpc::ClientContext ctx;
    inference::ModelInferResponse resp;
    grpc::Status s = stub_->ModelInfer(&ctx, req, &resp);
    if (!s.ok()) return s;
    EXPECT_EQ(resp.raw_output_contents(0).size(), static_cast<size_t>(rows) * 4);
    std::vector<float> y(rows);
    std::memcpy(y.data(), resp.raw_output_contents(0).data(), std::min(y.size() * 4, resp.raw_output_contents(0).size()));
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0, scale = 0;
      for (int c = 0; c < 1024; ++c) {
        want += x[r * 1024 + c];
        scale += std::fabs(x[r * 1024 + c]);
      }
      EXPECT_NEAR(y[r], want / 1024, 1e-5 * scale / 1024 + 1e-7) << "row " << r;
    }
    return s;
  }

  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(ReceiveBuffersTest, ALargeRawInputTakesABlockTheNextOneReuses) {
  EXPECT_EQ(Buffers("in_use"), 0);
  EXPECT_EQ(Buffers("idle"), 0);

  ASSERT_TRUE(RowMean(768).ok());  // 3 MiB
  const double idle = IdleOnceNoneInUse();
  EXPECT_GE(idle, 3.0 * kMiB) << "the 3 MiB input was not received into a block";
  EXPECT_LT(idle, 8.0 * kMiB);

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(RowMean(768).ok());
  EXPECT_EQ(IdleOnceNoneInUse(), idle) << "a request of the same size mapped another block";

  EXPECT_EQ(RowMean(768, /*wrong_shape=*/true).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(IdleOnceNoneInUse(), idle) << "a refused request kept its block";

  ASSERT_TRUE(RowMean(128).ok());  // 512 KiB: parsed into the message
  EXPECT_EQ(IdleOnceNoneInUse(), idle);
  EXPECT_TRUE(Serving());
}

TEST_F(ReceiveBuffersTest, ALargeExecuteInlineTensorIsReceivedIntoABlockAndComputedRight) {
  const client::HostTensor x = e2e::RandomFloats({768, 1024}, rng_);  // 3 MiB
  v1::ExecuteRequest req;
  AddInline(req, "x", x);
  AddNode(req, "m", "row_mean", {Inline("x")});
  AddOutput(req, "m", /*return_inline=*/true);
  for (int i = 0; i < 2; ++i) {
    auto r = client().Execute(req);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs_size(), 1);
    const std::string& y = r->outputs(0).tensor().data();
    ASSERT_EQ(y.size(), 768u * 4);
    const float* xs = reinterpret_cast<const float*>(x.data.data());
    for (int row = 0; row < 768; row += 97) {
      double want = 0;
      for (int c = 0; c < 1024; ++c) want += xs[row * 1024 + c];
      float got;
      std::memcpy(&got, y.data() + 4 * row, 4);
      EXPECT_NEAR(got, want / 1024, 1e-5) << "row " << row;
    }
  }
  const double idle = IdleOnceNoneInUse();
  EXPECT_GE(idle, 3.0 * kMiB) << "the 3 MiB inline tensor was not received into a block";
  EXPECT_LT(idle, 8.0 * kMiB) << "the second request mapped another block";

  // Its bytes and a shared memory region both: refused, naming the tensor, as for small data.
  v1::ExecuteRequest both = req;
  (*both.mutable_inline_tensors())["x"].mutable_shm()->set_region("r");
  EXPECT_TRUE(StatusIs(client().Execute(both).status(), absl::StatusCode::kInvalidArgument,
                       {"'x'", "not both"}));
  EXPECT_TRUE(Serving());
}

}  // namespace
}  // namespace opserve::hardening
