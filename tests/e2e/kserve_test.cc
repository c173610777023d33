// The Open Inference Protocol beside opserve.v1, through stubs generated from
// proto/inference/grpc_service.proto: every op model on every algorithm and dtype ListOps lists
// (checked against the op table's CPU reference, in this process), a saved graph, stored tensors
// in and out, system shared memory in and out, refusals that change nothing, ModelConfig and
// ModelStatistics, and the RPCs not served naming themselves. On the CPU in
// `make test`, on the GPU in the GPU suite (OPSERVE_TEST_DEVICE=cuda). tests/python/kserve_test.py
// covers the same ground from Python, written from the specification.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <tuple>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/engine/cpu_backend.h"
#include "tests/e2e/e2e_fixture.h"
#include "tests/support/request_builders.h"
#include "tests/support/result_check.h"

namespace opserve::e2e {
namespace {

using inference::GRPCInferenceService;
using test_support::Node;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

const char* Datatype(v1::DType d) {
  switch (d) {
    case v1::FLOAT32: return "FP32";
    case v1::INT32: return "INT32";
    case v1::INT64: return "INT64";
    case v1::BFLOAT16: return "BF16";
    default: return "?";
  }
}

// Inputs an op's arithmetic can check: floats in [-1, 1), small integers, bf16 of small floats.
client::HostTensor Input(v1::DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  client::HostTensor f = RandomFloats(shape, rng);
  if (dtype == v1::FLOAT32) return f;
  client::HostTensor t{dtype, shape, {}};
  const size_t n = f.data.size() / 4;
  t.data.resize(n * client::DTypeSize(dtype));
  std::uniform_int_distribution<int> v(-8, 8);
  for (size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, f.data.data() + 4 * i, 4);
    if (dtype == v1::INT32) reinterpret_cast<int32_t*>(t.data.data())[i] = v(rng);
    if (dtype == v1::INT64) reinterpret_cast<int64_t*>(t.data.data())[i] = int64_t{v(rng)} << 33;
    if (dtype == v1::BFLOAT16) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      reinterpret_cast<uint16_t*>(t.data.data())[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
  return t;
}

// The op table's CPU reference row on `in`, in this process.
std::string Reference(const OpSpec& op, const std::vector<client::HostTensor>& in, TensorMeta* out) {
  std::vector<TensorMeta> metas;
  std::vector<const void*> ptrs;
  for (const auto& t : in) {
    metas.push_back({static_cast<DType>(t.dtype), t.shape});
    ptrs.push_back(t.data.data());
  }
  *out = *op.infer(metas);
  std::string bytes(out->Bytes(), '\0');
  static Backend* const cpu = MakeCpuBackend(0).release();
  static ExecEnv* const env = cpu->NewExecEnv()->release();
  AttrMap attrs;
  KernelArgs args{ptrs, metas, bytes.data(), *out, attrs, *env};
  EXPECT_TRUE(CpuReference(op.name)->run(args).ok());
  (void)env->Finish(0);
  return bytes;
}

void AddRaw(ModelInferRequest& req, const std::string& name, const client::HostTensor& t) {
  auto* in = req.add_inputs();
  in->set_name(name);
  in->set_datatype(Datatype(t.dtype));
  for (int64_t d : t.shape) in->add_shape(d);
  req.add_raw_input_contents(t.data);
}

class KServeTest : public OpserveTest {
 protected:
  void SetUp() override {
    OpserveTest::SetUp();
    stub_ = GRPCInferenceService::NewStub(
        grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  }
  grpc::Status Infer(const ModelInferRequest& req, ModelInferResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->ModelInfer(&ctx, req, resp);
  }
  std::unique_ptr<GRPCInferenceService::Stub> stub_;
};

TEST_F(KServeTest, HealthAndMetadata) {
  grpc::ClientContext c1, c2, c3, c4;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(stub_->ServerLive(&c1, {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub_->ServerReady(&c2, {}, &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ServerMetadataResponse meta;
  ASSERT_TRUE(stub_->ServerMetadata(&c3, {}, &meta).ok());
  EXPECT_EQ(meta.name(), "opserve");
  std::set<std::string> ext(meta.extensions().begin(), meta.extensions().end());
  EXPECT_TRUE(ext.count("system_shared_memory"));
  EXPECT_EQ(ext.count("cuda_shared_memory"), IsCuda() ? 1u : 0u);
  inference::RepositoryIndexResponse index;
  ASSERT_TRUE(stub_->RepositoryIndex(&c4, {}, &index).ok());
  std::set<std::string> models;
  for (const auto& m : index.models()) models.insert(m.name());
  for (const OpSpec& op : Ops()) EXPECT_TRUE(models.count(std::string(op.name))) << op.name;
  // A model or version the server does not have is not ready, an answer as Triton gives it.
  for (const auto& [name, version] : {std::pair{"row_sum", ""}, {"row_sum", "1"},
                                      {"no_such_model", ""}, {"row_sum", "2"}}) {
    grpc::ClientContext ctx;
    inference::ModelReadyRequest req;
    req.set_name(name);
    req.set_version(version);
    inference::ModelReadyResponse model;
    const grpc::Status s = stub_->ModelReady(&ctx, req, &model);
    ASSERT_TRUE(s.ok()) << name << " " << version << ": " << s.error_message();
    EXPECT_EQ(model.ready(), std::string(name) == "row_sum" && std::string(version) != "2")
        << name << " " << version;
  }
}

// Every (op, algorithm, dtype) ListOps lists, through ModelInfer with `algorithm` set, against
// the CPU reference; the response names the algorithm that ran.
TEST_F(KServeTest, EveryOpModelAlgorithmAndDtypeMatchesTheReference) {
  auto ops = client().ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  int ran = 0;
  for (const v1::OpInfo& info : ops->ops()) {
    const OpSpec& op = *FindOp(info.name());
    for (const v1::AlgorithmInfo& algo : info.algorithms()) {
      for (int d : algo.dtypes()) {
        const auto dtype = static_cast<v1::DType>(d);
        SCOPED_TRACE(absl::StrCat(info.name(), "/", algo.name(), " ", Datatype(dtype)));
        std::vector<client::HostTensor> in;
        for (const auto& shape : op.test.small_shapes.front()) in.push_back(Input(dtype, shape, rng_));
        ModelInferRequest req;
        req.set_model_name(info.name());
        req.set_id("r1");
        (*req.mutable_parameters())["algorithm"].set_string_param(algo.name());
        const char* names[] = {"a", "b"};
        for (size_t i = 0; i < in.size(); ++i) AddRaw(req, in.size() == 1 ? "x" : names[i], in[i]);
        ModelInferResponse resp;
        grpc::Status s = Infer(req, &resp);
        ASSERT_TRUE(s.ok()) << s.error_message();
        EXPECT_EQ(resp.id(), "r1");
        ASSERT_EQ(resp.outputs_size(), 1);
        ASSERT_EQ(resp.raw_output_contents_size(), 1);
        EXPECT_EQ(resp.outputs(0).name(), "y");
        TensorMeta out;
        const std::string want = Reference(op, in, &out);
        EXPECT_EQ(resp.outputs(0).datatype(), Datatype(static_cast<v1::DType>(out.dtype)));
        EXPECT_EQ(std::vector<int64_t>(resp.outputs(0).shape().begin(), resp.outputs(0).shape().end()),
                  out.shape);
        const std::string& got = resp.raw_output_contents(0);
        ASSERT_EQ(got.size(), want.size());
        std::vector<TensorMeta> metas;
        std::vector<const void*> ptrs;
        for (const auto& t : in) {
          metas.push_back({static_cast<DType>(t.dtype), t.shape});
          ptrs.push_back(t.data.data());
        }
        // The named row, or the row it falls back to on shapes it does not take (tma's
        // transpose on small tiles, the sm90a matmul below its sizes): the response says which.
        const auto ran_algo = resp.parameters().at("algorithm").string_param();
        std::string fallback;
        for (const AlgoSpec& row : Algorithms()) {
          if (row.op == info.name() && row.name == algo.name() && row.backend == ops->backend()) {
            fallback = std::string(row.fallback);
          }
        }
        EXPECT_TRUE(ran_algo == algo.name() || ran_algo == fallback) << ran_algo;
        EXPECT_TRUE(CheckResult({op, metas, ptrs, out, got.data(), want.data()}, ran_algo).ok());
        EXPECT_GE(resp.parameters().at("kernel_us").double_param(), 0);
        ++ran;
      }
    }
  }
  EXPECT_GT(ran, 10);
}

// FP32 `contents` instead of raw bytes; an unknown algorithm, model, input, datatype, a byte
// count that disagrees with the shape, a datatype the op does not take, inputs of different
// datatypes: each refused, naming the culprit.
TEST_F(KServeTest, TypedContentsAndRefusals) {
  ModelInferRequest req;
  req.set_model_name("row_sum");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(2);
  in->add_shape(3);
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) in->mutable_contents()->add_fp32_contents(v);
  ModelInferResponse resp;
  ASSERT_TRUE(Infer(req, &resp).ok());
  std::vector<float> y(2);
  ASSERT_EQ(resp.raw_output_contents(0).size(), 8u);
  std::memcpy(y.data(), resp.raw_output_contents(0).data(), 8);
  EXPECT_EQ(y, (std::vector<float>{6.f, 15.f}));

  auto refused = [&](ModelInferRequest r, grpc::StatusCode code, const std::string& names) {
    ModelInferResponse out;
    grpc::Status s = Infer(r, &out);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(names), std::string::npos) << s.error_message();
  };
  ModelInferRequest r = req;
  (*r.mutable_parameters())["algorithm"].set_string_param("no_such_algo");
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "no_such_algo");
  r = req;
  r.set_model_name("no_such_model");
  refused(r, grpc::StatusCode::NOT_FOUND, "no_such_model");
  r = req;
  r.set_model_version("2");
  refused(r, grpc::StatusCode::NOT_FOUND, "'2'");
  r = req;
  r.mutable_inputs(0)->set_name("z");
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "'z'");
  r = req;
  r.mutable_inputs(0)->set_datatype("FP16");
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "FP16");
  r = req;
  r.mutable_inputs(0)->set_shape(1, 4);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "'x'");
  r = req;
  r.clear_inputs();
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "'x'");
  r = req;
  r.add_outputs()->set_name("w");
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "'w'");
  // Triton's sequences and classification, which opserve's models do not serve.
  r = req;
  (*r.mutable_parameters())["sequence_id"].set_uint64_param(9);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "model 'row_sum' is not a sequence model");
  r = req;
  (*r.mutable_parameters())["sequence_end"].set_bool_param(true);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "'sequence_end'");
  r = req;
  auto* classes = r.add_outputs();
  classes->set_name("y");
  (*classes->mutable_parameters())["classification"].set_int64_param(1);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT,
          "output 'y' of model 'row_sum': parameter 'classification'");

  // An op model's datatypes, in the protocol's names: one the op does not take, and inputs
  // that differ.
  ModelInferRequest mm;
  mm.set_model_name("matmul");
  AddRaw(mm, "a", Input(v1::INT32, {4, 8}, rng_));
  AddRaw(mm, "b", Input(v1::INT32, {8, 4}, rng_));
  refused(mm, grpc::StatusCode::INVALID_ARGUMENT, "input 'a': matmul takes FP32, BF16, not INT32");
  mm.Clear();
  mm.set_model_name("matmul");
  AddRaw(mm, "a", Input(v1::FLOAT32, {4, 8}, rng_));
  AddRaw(mm, "b", Input(v1::BFLOAT16, {8, 4}, rng_));
  refused(mm, grpc::StatusCode::INVALID_ARGUMENT, "input 'b' is BF16 and input 'a' FP32");
}

// raw_input_contents of 1 MiB and more are received into reused blocks, not into the message
// (server/rpc/receive_pool.h): fresh data each round, so a block handed out again with stale or
// shifted bytes fails the check; a refused request returns its block, and the next one works.
TEST_F(KServeTest, LargeRawInputsArriveWholeRequestAfterRequest) {
  const OpSpec& matmul = *FindOp("matmul");
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // a: 2.5 MiB, received into a block; b: 64 KiB, parsed into the message as before.
    std::vector<client::HostTensor> in = {RandomFloats({640, 1024}, rng_), RandomFloats({1024, 16}, rng_)};
    ModelInferRequest req;
    req.set_model_name("matmul");
    AddRaw(req, "a", in[0]);
    AddRaw(req, "b", in[1]);
    if (round == 1) {  // a byte count that disagrees with a's shape, first
      ModelInferRequest bad = req;
      bad.mutable_raw_input_contents(0)->append(4, '\0');
      ModelInferResponse out;
      grpc::Status s = Infer(bad, &out);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_NE(s.error_message().find("'a'"), std::string::npos) << s.error_message();
    }
    ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.raw_output_contents_size(), 1);
    TensorMeta out;
    const std::string want = Reference(matmul, in, &out);
    const std::string& got = resp.raw_output_contents(0);
    ASSERT_EQ(got.size(), want.size());
    std::vector<TensorMeta> metas = {{DType::kFloat32, in[0].shape}, {DType::kFloat32, in[1].shape}};
    std::vector<const void*> ptrs = {in[0].data.data(), in[1].data.data()};
    EXPECT_TRUE(CheckResult({matmul, metas, ptrs, out, got.data(), want.data()},
                            resp.parameters().at("algorithm").string_param())
                    .ok());
  }
}

// A graph saved with opserve.v1 runs as a model and answers as Execute does; a stored tensor
// feeds it, and its output is kept on the server.
TEST_F(KServeTest, SavedGraphWithStoredInputAndStoredOutput) {
  const int64_t n = 64;
  client::HostTensor a = RandomFloats({n, n}, rng_), b = RandomFloats({n, n}, rng_);
  ASSERT_TRUE(client().PutTensor("A", a, false).ok());
  v1::ExecuteRequest graph;
  AddNode(graph, "mm", "matmul", {Inline("a"), Inline("b")});
  AddNode(graph, "t", "transpose", {Node("mm")});
  AddNode(graph, "mean", "row_mean", {Node("t")});
  AddOutput(graph, "mean", true);
  // a: [-1, n] (any number of rows), b: [n, n].
  for (const char* name : {"a", "b"}) {
    v1::Tensor& t = (*graph.mutable_inline_tensors())[name];
    t.set_dtype(v1::FLOAT32);
    t.add_shape(name[0] == 'a' ? -1 : n);
    t.add_shape(n);
  }
  auto channel = grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials());
  auto ops = v1::OpServe::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::SaveGraphRequest save;
    save.set_name("g");
    *save.mutable_graph() = graph;
    v1::SaveGraphResponse saved;
    grpc::Status s = ops->SaveGraph(&ctx, save, &saved);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(saved.info().outputs_size(), 1);
    EXPECT_EQ(saved.info().outputs(0).name(), "mean");
    // row_mean(transpose(a @ b)) has one element per column of b: n, whatever a's rows.
    EXPECT_EQ(std::vector<int64_t>(saved.info().outputs(0).shape().begin(),
                                   saved.info().outputs(0).shape().end()),
              std::vector<int64_t>{n});
  }
  ModelInferRequest req;
  req.set_model_name("g");
  auto* in_a = req.add_inputs();
  in_a->set_name("a");
  in_a->set_datatype("FP32");
  in_a->add_shape(n);
  in_a->add_shape(n);
  (*in_a->mutable_parameters())["opserve_stored_tensor"].set_string_param("A");
  AddRaw(req, "b", b);
  auto* out = req.add_outputs();
  out->set_name("mean");
  (*out->mutable_parameters())["opserve_store_as"].set_string_param("MEAN");
  ModelInferResponse resp;
  grpc::Status s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.parameters().count("mm.algorithm"));
  EXPECT_TRUE(resp.raw_output_contents(0).empty());
  // The same graph through Execute, with the same algorithms.
  v1::ExecuteRequest exec = graph;
  exec.mutable_inline_tensors()->clear();
  exec.mutable_nodes(0)->mutable_inputs(0)->set_stored("A");
  AddInline(exec, "b", b);
  auto want = client().Execute(exec);
  ASSERT_TRUE(want.ok()) << want.status();
  auto kept = client().GetTensor("MEAN");
  ASSERT_TRUE(kept.ok()) << kept.status();
  if (Device() == "cpu") EXPECT_TRUE(kept->data == want->outputs(0).tensor().data());
  std::vector<float> x = Floats(kept->data), y = Floats(want->outputs(0).tensor().data());
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-4) << i;
}

// Inputs and outputs in a POSIX shared memory region the test maps too.
TEST_F(KServeTest, SystemSharedMemoryInAndOut) {
  const int64_t rows = 512, cols = 1024;
  const uint64_t in_bytes = rows * cols * 4, out_bytes = rows * 4;
  const std::string key = "/opserve_kserve_test_" + std::to_string(getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, in_bytes + 4096 + out_bytes), 0);
  char* map = static_cast<char*>(
      mmap(nullptr, in_bytes + 4096 + out_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  client::HostTensor x = RandomFloats({rows, cols}, rng_);
  std::memcpy(map, x.data.data(), in_bytes);
  grpc::ClientContext c1;
  inference::SystemSharedMemoryRegisterRequest reg;
  reg.set_name("r");
  reg.set_key(key);
  reg.set_byte_size(in_bytes + 4096 + out_bytes);
  inference::SystemSharedMemoryRegisterResponse reg_resp;
  grpc::Status s = stub_->SystemSharedMemoryRegister(&c1, reg, &reg_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();

  ModelInferRequest req;
  req.set_model_name("row_mean");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(cols);
  (*in->mutable_parameters())["shared_memory_region"].set_string_param("r");
  (*in->mutable_parameters())["shared_memory_byte_size"].set_int64_param(in_bytes);
  auto* out = req.add_outputs();
  out->set_name("y");
  (*out->mutable_parameters())["shared_memory_region"].set_string_param("r");
  (*out->mutable_parameters())["shared_memory_offset"].set_int64_param(in_bytes + 4096);
  (*out->mutable_parameters())["shared_memory_byte_size"].set_int64_param(out_bytes);
  ModelInferResponse resp;
  s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.raw_output_contents(0).empty());
  TensorMeta meta;
  const std::string want = Reference(*FindOp("row_mean"), {x}, &meta);
  std::vector<TensorMeta> metas = {{DType::kFloat32, x.shape}};
  std::vector<const void*> ptrs = {x.data.data()};
  EXPECT_TRUE(CheckResult({*FindOp("row_mean"), metas, ptrs, meta, map + in_bytes + 4096, want.data()},
                          resp.parameters().at("algorithm").string_param())
                  .ok());

  // Past the region's end, and a size that is not the tensor's: refused, nothing written.
  std::memset(map + in_bytes + 4096, 0x7f, out_bytes);
  ModelInferRequest bad = req;
  (*bad.mutable_outputs(0)->mutable_parameters())["shared_memory_offset"].set_int64_param(in_bytes + 8192);
  s = Infer(bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("'r'"), std::string::npos) << s.error_message();
  bad = req;
  (*bad.mutable_inputs(0)->mutable_parameters())["shared_memory_byte_size"].set_int64_param(in_bytes - 4);
  s = Infer(bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(static_cast<unsigned char>(map[in_bytes + 4096]), 0x7fu);

  grpc::ClientContext c2, c3, c4;
  inference::SystemSharedMemoryStatusResponse status;
  ASSERT_TRUE(stub_->SystemSharedMemoryStatus(&c2, {}, &status).ok());
  EXPECT_EQ(status.regions().at("r").key(), key);
  inference::SystemSharedMemoryRegisterResponse again;
  EXPECT_EQ(stub_->SystemSharedMemoryRegister(&c3, reg, &again).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  inference::SystemSharedMemoryUnregisterRequest unreg;
  unreg.set_name("r");
  inference::SystemSharedMemoryUnregisterResponse unreg_resp;
  EXPECT_TRUE(stub_->SystemSharedMemoryUnregister(&c4, unreg, &unreg_resp).ok());
  s = Infer(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  munmap(map, in_bytes + 4096 + out_bytes);
  shm_unlink(key.c_str());
}


// opserve.v1 names registered regions too: a PutTensor header, a GetTensor request and an Execute
// inline tensor; the bytes equal the socket's. Refusals name the region and change nothing.
TEST_F(KServeTest, OpServeV1ReadsAndWritesRegions) {
  const client::HostTensor x = RandomFloats({300, 500}, rng_);
  auto put = client().PutTensorShm("X", x, false);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->bytes(), x.data.size());
  auto back = client().GetTensor("X");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == x.data);
  auto back_shm = client().GetTensorShm("X");
  ASSERT_TRUE(back_shm.ok()) << back_shm.status();
  EXPECT_TRUE(back_shm->data == x.data);

  // An Execute inline tensor in a region, against the same tensor sent inline.
  const std::string key = "/opserve_v1_region_" + std::to_string(getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, x.data.size()), 0);
  char* map = static_cast<char*>(mmap(nullptr, x.data.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  std::memcpy(map, x.data.data(), x.data.size());
  {
    grpc::ClientContext ctx;
    inference::SystemSharedMemoryRegisterRequest reg;
    reg.set_name("in");
    reg.set_key(key);
    reg.set_byte_size(x.data.size());
    inference::SystemSharedMemoryRegisterResponse r;
    ASSERT_TRUE(stub_->SystemSharedMemoryRegister(&ctx, reg, &r).ok());
  }
  v1::ExecuteRequest via_region, via_bytes;
  for (v1::ExecuteRequest* r : {&via_region, &via_bytes}) {
    AddNode(*r, "s", "row_sum", {Inline("x")}, Device() == "cpu" ? "reference" : "block_per_row");
    AddOutput(*r, "s", true);
  }
  AddInline(via_bytes, "x", x);
  v1::Tensor& t = (*via_region.mutable_inline_tensors())["x"];
  t.set_dtype(v1::FLOAT32);
  t.add_shape(300);
  t.add_shape(500);
  t.mutable_shm()->set_region("in");
  t.mutable_shm()->set_byte_size(x.data.size());
  auto a = client().Execute(via_region), b = client().Execute(via_bytes);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(a->outputs(0).tensor().data() == b->outputs(0).tensor().data());

  // Refusals: a region that does not exist, a size that is not the tensor's, a region too small
  // for GetTensor, a chunk after a header that named a region.
  const StoreSnapshot before = Snapshot(client());
  t.mutable_shm()->set_region("nowhere");
  EXPECT_TRUE(StatusIs(client().Execute(via_region).status(), absl::StatusCode::kNotFound,
                       {"'x'", "'nowhere'"}));
  auto put_header = [&](uint64_t byte_size, bool chunk) {
    grpc::ClientContext ctx;
    v1::PutTensorResponse resp;
    auto writer = stub().PutTensor(&ctx, &resp);
    v1::PutTensorRequest m;
    auto* h = m.mutable_header();
    h->set_name("Y");
    h->set_dtype(v1::FLOAT32);
    h->add_shape(300);
    h->add_shape(500);
    h->mutable_shm()->set_region("in");
    h->mutable_shm()->set_byte_size(byte_size);
    writer->Write(m);
    if (chunk) {
      v1::PutTensorRequest c;
      c.set_chunk("abcd");
      writer->Write(c);
    }
    writer->WritesDone();
    return writer->Finish();
  };
  grpc::Status s = put_header(x.data.size() - 4, false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("byte_size"), std::string::npos) << s.error_message();
  s = put_header(x.data.size(), true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("no chunk"), std::string::npos) << s.error_message();
  {
    grpc::ClientContext ctx;
    v1::GetTensorRequest req;
    req.set_name("X");
    req.mutable_shm()->set_region("in");
    req.mutable_shm()->set_byte_size(100);
    auto reader = stub().GetTensor(&ctx, req);
    v1::GetTensorResponse msg;
    while (reader->Read(&msg)) {
    }
    s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  EXPECT_TRUE(SameStore(before, Snapshot(client())));
  munmap(map, x.data.size());
  shm_unlink(key.c_str());
}

// A client unregisters its region as soon as its call is answered (tritonclient's order, and the
// client library's PutTensorShm / GetTensorShm): the server must have let go of the region by
// then, or the unregister finds it "in use by a request in flight". Many round trips, because
// the window is the few microseconds between the answer and the copy's clean-up. (With that
// window widened by a 2 ms sleep, the server that released GetTensor's region after writing its
// answer failed this at round 0.)
TEST_F(KServeTest, RegionsAreFreeOnceTheirCallIsAnswered) {
  const client::HostTensor x = RandomFloats({64, 64}, rng_);
  ASSERT_TRUE(client().PutTensor("X", x, false).ok());
  for (int i = 0; i < 300; ++i) {
    auto back = client().GetTensorShm("X");
    ASSERT_TRUE(back.ok()) << "round " << i << ": " << back.status();
    ASSERT_TRUE(back->data == x.data) << "round " << i;
    auto put = client().PutTensorShm("Y", x, true);
    ASSERT_TRUE(put.ok()) << "round " << i << ": " << put.status();
  }
}

// A client killed mid-transfer leaves its shm object behind, and a later process may get its pid:
// the client library steps over names that exist instead of failing. (Run as its own process by
// ctest, this process's names start at 0, so the objects below are the ones it would take.)
TEST_F(KServeTest, ShmTransfersStepOverObjectsALostClientLeft) {
  std::vector<std::string> stale;
  for (int i = 0; i < 8; ++i) {
    const std::string key = absl::StrCat("/opserve-client-", getpid(), "-", i);
    const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      close(fd);
      stale.push_back(key);
    }
  }
  const client::HostTensor x = RandomFloats({64, 48}, rng_);
  auto put = client().PutTensorShm("X", x, false);
  auto back = client().GetTensorShm("X");
  for (const std::string& key : stale) shm_unlink(key.c_str());
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->data == x.data);
}

// ---- ModelConfig, ModelStatistics and the RPCs not served ----

// Saves `graph` as `name` through opserve.v1 (overwriting).
void SaveGraph(const std::string& target, const std::string& name, const v1::ExecuteRequest& graph) {
  auto ops = v1::OpServe::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::SaveGraphRequest save;
  save.set_name(name);
  save.set_overwrite(true);
  *save.mutable_graph() = graph;
  v1::SaveGraphResponse saved;
  grpc::Status s = ops->SaveGraph(&ctx, save, &saved);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// row_mean(a @ b), a: [-1, n] FP32, b: [n, n] FP32.
v1::ExecuteRequest MeanOfProduct(int64_t n) {
  v1::ExecuteRequest graph;
  AddNode(graph, "mm", "matmul", {Inline("a"), Inline("b")});
  AddNode(graph, "mean", "row_mean", {Node("mm")});
  AddOutput(graph, "mean", true);
  for (const char* name : {"a", "b"}) {
    v1::Tensor& t = (*graph.mutable_inline_tensors())[name];
    t.set_dtype(v1::FLOAT32);
    t.add_shape(name[0] == 'a' ? -1 : n);
    t.add_shape(n);
  }
  return graph;
}

std::vector<int64_t> Dims(const google::protobuf::RepeatedField<int64_t>& d) {
  return {d.begin(), d.end()};
}

// Every op model's configuration says what its metadata says, in model_config.proto's terms;
// a saved graph's has its planned shapes; an unknown model or version is NOT_FOUND by name.
TEST_F(KServeTest, ModelConfigOfOpModelsAndASavedGraph) {
  for (const OpSpec& op : Ops()) {
    SCOPED_TRACE(op.name);
    grpc::ClientContext c1, c2;
    inference::ModelConfigRequest req;
    req.set_name(std::string(op.name));
    inference::ModelConfigResponse resp;
    grpc::Status s = stub_->ModelConfig(&c1, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    inference::ModelMetadataRequest mreq;
    mreq.set_name(std::string(op.name));
    inference::ModelMetadataResponse meta;
    ASSERT_TRUE(stub_->ModelMetadata(&c2, mreq, &meta).ok());
    const inference::ModelConfig& config = resp.config();
    EXPECT_EQ(config.name(), op.name);
    EXPECT_EQ(config.platform(), "opserve_op");
    EXPECT_EQ(config.backend(), "opserve");
    // No batch dimension of Triton's kind: the shapes are whole (docs/API.md).
    EXPECT_EQ(config.max_batch_size(), 0);
    ASSERT_TRUE(config.parameters().count("opserve_max_batch_size"));
    EXPECT_EQ(config.parameters().at("opserve_max_batch_size").string_value(), "1");
    ASSERT_EQ(config.input_size(), meta.inputs_size());
    for (int i = 0; i < config.input_size(); ++i) {
      EXPECT_EQ(config.input(i).name(), meta.inputs(i).name());
      EXPECT_EQ(inference::DataType_Name(config.input(i).data_type()),
                "TYPE_" + meta.inputs(i).datatype());
      EXPECT_EQ(Dims(config.input(i).dims()), Dims(meta.inputs(i).shape()));
      for (int64_t d : config.input(i).dims()) EXPECT_EQ(d, -1);
    }
    ASSERT_EQ(config.output_size(), 1);
    EXPECT_EQ(config.output(0).name(), "y");
    EXPECT_NE(config.output(0).data_type(), inference::TYPE_INVALID);
    EXPECT_EQ(Dims(config.output(0).dims()), Dims(meta.outputs(0).shape()));
  }
  {  // matmul in full: two FP32 matrices of any size in, one out
    grpc::ClientContext ctx;
    inference::ModelConfigRequest req;
    req.set_name("matmul");
    req.set_version("1");
    inference::ModelConfigResponse resp;
    ASSERT_TRUE(stub_->ModelConfig(&ctx, req, &resp).ok());
    const inference::ModelConfig& c = resp.config();
    ASSERT_EQ(c.input_size(), 2);
    EXPECT_EQ(c.input(0).name(), "a");
    EXPECT_EQ(c.input(1).name(), "b");
    for (const auto& in : c.input()) {
      EXPECT_EQ(in.data_type(), inference::TYPE_FP32);
      EXPECT_EQ(Dims(in.dims()), (std::vector<int64_t>{-1, -1}));
    }
    EXPECT_EQ(c.output(0).data_type(), inference::TYPE_FP32);
    EXPECT_EQ(Dims(c.output(0).dims()), (std::vector<int64_t>{-1, -1}));
  }
  const int64_t n = 32;
  SaveGraph(server().target(), "g", MeanOfProduct(n));
  {
    grpc::ClientContext ctx;
    inference::ModelConfigRequest req;
    req.set_name("g");
    inference::ModelConfigResponse resp;
    grpc::Status s = stub_->ModelConfig(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const inference::ModelConfig& c = resp.config();
    EXPECT_EQ(c.name(), "g");
    EXPECT_EQ(c.platform(), "opserve_graph");
    EXPECT_EQ(c.backend(), "opserve");
    EXPECT_EQ(c.max_batch_size(), 0);
    std::map<std::string, std::vector<int64_t>> inputs;
    for (const auto& in : c.input()) {
      EXPECT_EQ(in.data_type(), inference::TYPE_FP32) << in.name();
      inputs[in.name()] = Dims(in.dims());
    }
    EXPECT_EQ(inputs, (std::map<std::string, std::vector<int64_t>>{{"a", {-1, n}}, {"b", {n, n}}}));
    ASSERT_EQ(c.output_size(), 1);
    EXPECT_EQ(c.output(0).name(), "mean");
    EXPECT_EQ(c.output(0).data_type(), inference::TYPE_FP32);
    EXPECT_EQ(Dims(c.output(0).dims()), (std::vector<int64_t>{-1}));
  }
  for (const auto& [name, version, culprit] :
       {std::tuple{"no_such_model", "", "no_such_model"}, std::tuple{"row_sum", "2", "'2'"}}) {
    grpc::ClientContext ctx;
    inference::ModelConfigRequest req;
    req.set_name(name);
    req.set_version(version);
    inference::ModelConfigResponse resp;
    grpc::Status s = stub_->ModelConfig(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_NE(s.error_message().find(culprit), std::string::npos) << s.error_message();
  }
}

class KServeBatchingTest : public KServeTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--max_batch_size=8"}; }
};

TEST_F(KServeBatchingTest, ModelConfigNamesTheServersBatchSize) {
  grpc::ClientContext ctx;
  inference::ModelConfigRequest req;
  req.set_name("row_sum");
  inference::ModelConfigResponse resp;
  ASSERT_TRUE(stub_->ModelConfig(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.config().max_batch_size(), 0);
  EXPECT_EQ(resp.config().parameters().at("opserve_max_batch_size").string_value(), "8");
}

uint64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Each ModelInfer is counted in its model's statistics: the successes with their times, whose
// parts add up to no more than the requests took as the client saw them, and a refused request
// as a failure; a model not run has zeros, and a saved graph saved again starts from zero.
TEST_F(KServeTest, ModelStatisticsCountEachModelInfer) {
  auto stats = [&](const std::string& name, const std::string& version = "") {
    grpc::ClientContext ctx;
    inference::ModelStatisticsRequest req;
    req.set_name(name);
    req.set_version(version);
    inference::ModelStatisticsResponse resp;
    grpc::Status s = stub_->ModelStatistics(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.model_stats_size(), 1);
    return resp.model_stats_size() == 1 ? resp.model_stats(0) : inference::ModelStatistics();
  };
  const uint64_t before_ms = NowMs();
  const int kOk = 5;
  std::chrono::nanoseconds wall{0};
  for (int i = 0; i < kOk; ++i) {
    ModelInferRequest req;
    req.set_model_name("row_sum");
    AddRaw(req, "x", RandomFloats({16, 64}, rng_));
    ModelInferResponse resp;
    const auto t0 = std::chrono::steady_clock::now();
    grpc::Status s = Infer(req, &resp);
    wall += std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  {  // raw bytes that disagree with the shape: refused, counted as a failure
    ModelInferRequest req;
    req.set_model_name("row_sum");
    AddRaw(req, "x", RandomFloats({16, 64}, rng_));
    req.mutable_inputs(0)->set_shape(0, 15);
    ModelInferResponse resp;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(Infer(req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    wall += std::chrono::steady_clock::now() - t0;
  }
  {  // no such model, no such version: no model's to count
    ModelInferRequest req;
    req.set_model_name("no_such_model");
    AddRaw(req, "x", RandomFloats({2, 2}, rng_));
    ModelInferResponse resp;
    EXPECT_EQ(Infer(req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
    req.set_model_name("row_sum");
    req.set_model_version("2");
    EXPECT_EQ(Infer(req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  const uint64_t wall_ns = static_cast<uint64_t>(wall.count());
  const inference::ModelStatistics rs = stats("row_sum", "1");
  EXPECT_EQ(rs.name(), "row_sum");
  EXPECT_EQ(rs.version(), "1");
  EXPECT_EQ(rs.inference_count(), uint64_t{kOk});
  EXPECT_EQ(rs.execution_count(), uint64_t{kOk});  // --max_batch_size 1: one run each
  const inference::InferStatistics& is = rs.inference_stats();
  EXPECT_EQ(is.success().count(), uint64_t{kOk});
  EXPECT_EQ(is.fail().count(), 1u);
  for (const auto* d : {&is.queue(), &is.compute_input(), &is.compute_infer(), &is.compute_output()}) {
    EXPECT_EQ(d->count(), uint64_t{kOk});
  }
  const uint64_t parts =
      is.queue().ns() + is.compute_input().ns() + is.compute_infer().ns() + is.compute_output().ns();
  EXPECT_GT(parts, 0u);
  EXPECT_GT(is.compute_infer().ns(), 0u);
  EXPECT_LE(parts, is.success().ns());
  EXPECT_GT(is.fail().ns(), 0u);
  EXPECT_LE(is.success().ns() + is.fail().ns(), wall_ns);
  EXPECT_GE(rs.last_inference(), before_ms);
  EXPECT_LE(rs.last_inference(), NowMs());

  const inference::ModelStatistics mm = stats("matmul");  // never run: zeros
  EXPECT_EQ(mm.name(), "matmul");
  EXPECT_EQ(mm.inference_count(), 0u);
  EXPECT_EQ(mm.last_inference(), 0u);
  // Every duration is there, as Triton gives them for a model never run.
  ASSERT_TRUE(mm.has_inference_stats());
  const inference::InferStatistics& ms = mm.inference_stats();
  for (const auto* d : {&ms.success(), &ms.fail(), &ms.queue(), &ms.compute_input(),
                        &ms.compute_infer(), &ms.compute_output()}) {
    EXPECT_EQ(d->count(), 0u);
    EXPECT_EQ(d->ns(), 0u);
  }
  EXPECT_TRUE(ms.has_success() && ms.has_fail() && ms.has_queue() && ms.has_compute_input() &&
              ms.has_compute_infer() && ms.has_compute_output());

  const int64_t n = 16;
  SaveGraph(server().target(), "g", MeanOfProduct(n));
  for (int i = 0; i < 2; ++i) {
    ModelInferRequest req;
    req.set_model_name("g");
    AddRaw(req, "a", RandomFloats({8, n}, rng_));
    AddRaw(req, "b", RandomFloats({n, n}, rng_));
    ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(stats("g").inference_count(), 2u);
  EXPECT_EQ(stats("row_sum").inference_count(), uint64_t{kOk});  // the graph's matmul is g's
  {  // every model: each op and the saved graph, once
    grpc::ClientContext ctx;
    inference::ModelStatisticsResponse all;
    ASSERT_TRUE(stub_->ModelStatistics(&ctx, {}, &all).ok());
    std::map<std::string, uint64_t> counts;
    for (const auto& m : all.model_stats()) {
      EXPECT_TRUE(counts.emplace(m.name(), m.inference_count()).second) << m.name();
    }
    EXPECT_EQ(counts.size(), Ops().size() + 1);
    EXPECT_EQ(counts["row_sum"], uint64_t{kOk});
    EXPECT_EQ(counts["g"], 2u);
    EXPECT_EQ(counts["matmul"], 0u);
  }
  SaveGraph(server().target(), "g", MeanOfProduct(n));  // another graph under the name
  EXPECT_EQ(stats("g").inference_count(), 0u);

  for (const auto& [name, version, culprit] :
       {std::tuple{"no_such_model", "", "no_such_model"}, std::tuple{"row_sum", "2", "'2'"}}) {
    grpc::ClientContext ctx;
    inference::ModelStatisticsRequest req;
    req.set_name(name);
    req.set_version(version);
    inference::ModelStatisticsResponse resp;
    grpc::Status s = stub_->ModelStatistics(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_NE(s.error_message().find(culprit), std::string::npos) << s.error_message();
  }
}

// The specification's RPCs opserve does not serve answer UNIMPLEMENTED with a message naming
// them, not gRPC's empty one.
TEST_F(KServeTest, RpcsNotServedNameThemselves) {
  auto named = [](const grpc::Status& s, const std::string& rpc) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << rpc << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(rpc + " is not served by opserve"), std::string::npos)
        << s.error_message();
  };
  {
    grpc::ClientContext ctx;
    inference::RepositoryModelLoadResponse resp;
    named(stub_->RepositoryModelLoad(&ctx, {}, &resp), "RepositoryModelLoad");
  }
  {
    grpc::ClientContext ctx;
    inference::RepositoryModelUnloadResponse resp;
    named(stub_->RepositoryModelUnload(&ctx, {}, &resp), "RepositoryModelUnload");
  }
  {
    grpc::ClientContext ctx;
    inference::TraceSettingResponse resp;
    named(stub_->TraceSetting(&ctx, {}, &resp), "TraceSetting");
  }
  {
    grpc::ClientContext ctx;
    inference::LogSettingsResponse resp;
    named(stub_->LogSettings(&ctx, {}, &resp), "LogSettings");
  }
}

}  // namespace
}  // namespace opserve::e2e
