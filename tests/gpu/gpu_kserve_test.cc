// CUDA shared memory (Triton's extension) end to end: this test process is the client, a second
// process beside the real `opserve --device=cuda`. It allocates device memory, shares it through
// a cudaIpcMemHandle_t, and the server's kernel reads the input and writes the output there in
// place; the result is read back here and checked against the CPU reference. Skipped (not
// passed) where no GPU is usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "inference/grpc_service.grpc.pb.h"
#include "tests/gpu/gpu_server_fixture.h"

namespace opserve::e2e {
namespace {

class GpuKServeTest : public GpuServerTest {
 protected:
  void SetUp() override {
    GpuServerTest::SetUp();
    if (IsSkipped()) return;
    stub_ = inference::GRPCInferenceService::NewStub(
        grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  }
  grpc::Status Register(const std::string& name, const cudaIpcMemHandle_t& h, int64_t device,
                        uint64_t bytes) {
    grpc::ClientContext ctx;
    inference::CudaSharedMemoryRegisterRequest req;
    req.set_name(name);
    req.set_raw_handle(std::string(reinterpret_cast<const char*>(&h), sizeof(h)));
    req.set_device_id(device);
    req.set_byte_size(bytes);
    inference::CudaSharedMemoryRegisterResponse resp;
    return stub_->CudaSharedMemoryRegister(&ctx, req, &resp);
  }
  // The server's GPU ("cuda:1" -> 1): the region is made there.
  static int Ordinal() {
    const std::string d = Device();
    return d.size() > 5 ? std::atoi(d.c_str() + 5) : 0;
  }
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(GpuKServeTest, CudaSharedMemoryInputAndOutputInPlace) {
  const int64_t rows = 1000, cols = 4099;
  const uint64_t in_bytes = rows * cols * 4, out_offset = (in_bytes + 255) / 256 * 256;
  const uint64_t bytes = out_offset + rows * 4;
  void* dev = nullptr;
  ASSERT_EQ(cudaSetDevice(Ordinal()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dev, bytes), cudaSuccess);
  client::HostTensor x = RandomFloats({rows, cols}, rng_);
  ASSERT_EQ(cudaMemcpy(dev, x.data.data(), in_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(static_cast<char*>(dev) + out_offset, 0xff, rows * 4), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, dev), cudaSuccess);

  // Another device's id is refused, naming both.
  grpc::Status s = Register("elsewhere", handle, 7, bytes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("device 7"), std::string::npos) << s.error_message();
  s = Register("buf", handle, Ordinal(), bytes);
  ASSERT_TRUE(s.ok()) << s.error_message();

  inference::ModelInferRequest req;
  req.set_model_name("row_mean");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(cols);
  (*in->mutable_parameters())["shared_memory_region"].set_string_param("buf");
  (*in->mutable_parameters())["shared_memory_byte_size"].set_uint64_param(in_bytes);
  auto* out = req.add_outputs();
  out->set_name("y");
  (*out->mutable_parameters())["shared_memory_region"].set_string_param("buf");
  (*out->mutable_parameters())["shared_memory_offset"].set_uint64_param(out_offset);
  (*out->mutable_parameters())["shared_memory_byte_size"].set_uint64_param(rows * 4);
  inference::ModelInferResponse resp;
  {
    grpc::ClientContext ctx;
    s = stub_->ModelInfer(&ctx, req, &resp);
  }
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.raw_output_contents(0).empty());
  std::string got(rows * 4, '\0');
  ASSERT_EQ(cudaMemcpy(got.data(), static_cast<char*>(dev) + out_offset, got.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  // Each row's mean in double: row_mean's tolerance on FP32 inputs in [-1, 1).
  std::vector<float> xf = Floats(x.data), y = Floats(got);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += xf[r * cols + c];
    ASSERT_NEAR(y[r], sum / cols, 1e-5) << "row " << r;
  }

  {  // Status lists it; unregistering closes it, and a request naming it is then NOT_FOUND.
    grpc::ClientContext c1, c2, c3;
    inference::CudaSharedMemoryStatusResponse status;
    ASSERT_TRUE(stub_->CudaSharedMemoryStatus(&c1, {}, &status).ok());
    EXPECT_EQ(status.regions().at("buf").byte_size(), bytes);
    inference::CudaSharedMemoryUnregisterRequest un;
    un.set_name("buf");
    inference::CudaSharedMemoryUnregisterResponse un_resp;
    EXPECT_TRUE(stub_->CudaSharedMemoryUnregister(&c2, un, &un_resp).ok());
    s = stub_->ModelInfer(&c3, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  cudaFree(dev);
}

}  // namespace
}  // namespace opserve::e2e
