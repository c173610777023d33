#include "tests/e2e/node_fixture.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/ops/host_kernel_env.h"
#include "server/ops/op.h"
#include "server/ops/op_util.h"
#include "tests/support/result_check.h"

namespace opserve::e2e {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

namespace {

// Upload chunks: small enough that every test tensor takes several, as a real client's would.
constexpr size_t kChunkBytes = 1 << 20;

}  // namespace

// ---- NodeClient ----

NodeClient::NodeClient(const std::string& target, std::string token) : token_(std::move(token)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::OpServe::NewStub(channel);
  inference_ = inference::GRPCInferenceService::NewStub(channel);
}

void NodeClient::Prepare(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
}

absl::StatusOr<v1::TensorInfo> NodeClient::Put(const std::string& name, const client::HostTensor& t,
                                               const PutOptions& options) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::PutTensorResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::PutTensorRequest>> w = stub_->PutTensor(&ctx, &resp);
  v1::PutTensorRequest m;
  v1::PutTensorHeader* h = m.mutable_header();
  h->set_name(name);
  h->set_dtype(t.dtype);
  h->mutable_shape()->Add(t.shape.begin(), t.shape.end());
  h->set_overwrite(options.overwrite);
  h->set_device(options.device);
  h->set_shard(options.shard);
  // A write fails once the server has answered (a refused header): Finish then has its status.
  bool open = w->Write(m);
  for (size_t at = 0; open && at < t.data.size(); at += kChunkBytes) {
    v1::PutTensorRequest chunk;
    chunk.set_chunk(t.data.substr(at, kChunkBytes));
    open = w->Write(chunk);
  }
  w->WritesDone();
  grpc::Status s = w->Finish();
  if (!s.ok()) return client::ToAbslStatus(s);
  return resp.info();
}

absl::StatusOr<GotTensor> NodeClient::Get(const std::string& name) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::GetTensorRequest req;
  req.set_name(name);
  std::unique_ptr<grpc::ClientReader<v1::GetTensorResponse>> r = stub_->GetTensor(&ctx, req);
  GotTensor got;
  v1::GetTensorResponse m;
  bool have_info = false;
  while (r->Read(&m)) {
    if (m.has_info()) {
      got.info = m.info();
      have_info = true;
    } else {
      got.tensor.data += m.chunk();
    }
  }
  grpc::Status s = r->Finish();
  if (!s.ok()) return client::ToAbslStatus(s);
  if (!have_info) return absl::DataLossError("GetTensor answered no info message");
  got.tensor.dtype = got.info.dtype();
  got.tensor.shape.assign(got.info.shape().begin(), got.info.shape().end());
  return got;
}

absl::StatusOr<std::vector<v1::TensorInfo>> NodeClient::List() {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::ListTensorsResponse resp;
  grpc::Status s = stub_->ListTensors(&ctx, {}, &resp);
  if (!s.ok()) return client::ToAbslStatus(s);
  return std::vector<v1::TensorInfo>(resp.tensors().begin(), resp.tensors().end());
}

absl::StatusOr<v1::TensorInfo> NodeClient::Listed(const std::string& name) {
  absl::StatusOr<std::vector<v1::TensorInfo>> all = List();
  if (!all.ok()) return all.status();
  for (const v1::TensorInfo& info : *all) {
    if (info.name() == name) return info;
  }
  return absl::NotFoundError(absl::StrCat("ListTensors does not list '", name, "'"));
}

absl::StatusOr<v1::MoveTensorResponse> NodeClient::Move(const std::string& name,
                                                        const std::string& device) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::MoveTensorRequest req;
  req.set_name(name);
  req.set_device(device);
  v1::MoveTensorResponse resp;
  grpc::Status s = stub_->MoveTensor(&ctx, req, &resp);
  if (!s.ok()) return client::ToAbslStatus(s);
  return resp;
}

absl::StatusOr<v1::TensorInfo> NodeClient::Delete(const std::string& name) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::DeleteTensorRequest req;
  req.set_name(name);
  v1::DeleteTensorResponse resp;
  grpc::Status s = stub_->DeleteTensor(&ctx, req, &resp);
  if (!s.ok()) return client::ToAbslStatus(s);
  return resp.info();
}

absl::StatusOr<v1::ExecuteResponse> NodeClient::Execute(const v1::ExecuteRequest& request) {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::ExecuteResponse resp;
  grpc::Status s = stub_->Execute(&ctx, request, &resp);
  if (!s.ok()) return client::ToAbslStatus(s);
  return resp;
}

absl::StatusOr<v1::ListOpsResponse> NodeClient::ListOps() {
  grpc::ClientContext ctx;
  Prepare(ctx);
  v1::ListOpsResponse resp;
  grpc::Status s = stub_->ListOps(&ctx, {}, &resp);
  if (!s.ok()) return client::ToAbslStatus(s);
  return resp;
}

absl::StatusOr<inference::ServerMetadataResponse> NodeClient::ServerMetadata() {
  grpc::ClientContext ctx;
  Prepare(ctx);
  inference::ServerMetadataResponse resp;
  grpc::Status s = inference_->ServerMetadata(&ctx, {}, &resp);
  if (!s.ok()) return client::ToAbslStatus(s);
  return resp;
}

// ---- NodeTest ----

void NodeTest::SetUp() {
  const char* seed = std::getenv("OPSERVE_TEST_SEED");
  seed_ =
      seed != nullptr && *seed != '\0' ? std::strtoull(seed, nullptr, 10) : std::random_device{}();
  rng_.seed(seed_);
  const int wanted = GetParam();
  std::vector<std::string> flags = NodeFlags();
  // After the fixture's own --device (one GPU in the GPU suite), so this one counts: N CPU
  // devices, or every visible GPU.
  flags.insert(flags.begin(), Device() == "cpu" ? absl::StrCat("--device=cpu:", wanted)
                                                : std::string("--device=cuda"));
  ASSERT_NO_FATAL_FAILURE(Restart(flags));
  node_ = std::make_unique<NodeClient>(server().target(), Token());
  absl::StatusOr<v1::ListOpsResponse> ops = node_->ListOps();
  ASSERT_TRUE(ops.ok()) << ops.status();
  if (Device() != "cpu") {
    if (ops->devices_size() < wanted) {
      GTEST_SKIP() << "needs " << wanted << " GPUs; --device=cuda serves " << ops->devices_size();
    }
    if (wanted > 2 && ops->devices_size() != wanted) {
      std::vector<std::string> list;
      for (int i = 0; i < wanted; ++i) list.push_back(std::to_string(i));
      flags.front() = absl::StrCat("--device=cuda:", absl::StrJoin(list, ","));
      ASSERT_NO_FATAL_FAILURE(Restart(flags));
      node_ = std::make_unique<NodeClient>(server().target(), Token());
      ops = node_->ListOps();
      ASSERT_TRUE(ops.ok()) << ops.status();
    }
  }
  names_.clear();
  for (const v1::DeviceInfo& d : ops->devices()) names_.push_back(d.name());
  ASSERT_GE(n(), 2) << "ListOps lists " << n() << " devices for " << flags.front();
  if (Device() == "cpu") ASSERT_EQ(n(), wanted) << "--device=cpu:" << wanted;
}

void NodeTest::TearDown() {
  if (HasFailure()) {
    std::cerr << "random seed " << seed_ << " (OPSERVE_TEST_SEED=" << seed_
              << " draws the same data)\n";
  }
  node_.reset();
  OpserveTest::TearDown();
}

std::string NodeTest::Unserved() const {
  const std::string prefix = Device() == "cpu" ? "cpu" : "cuda";
  // Past every index a served name can have: "cpu:7" for two or three CPU devices.
  return absl::StrCat(prefix, ":", std::max(7, n() + 5));
}

std::string NodeTest::Joined(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ",");
}

std::unique_ptr<NodeClient> NodeTest::Connect(const std::string& token) {
  return std::make_unique<NodeClient>(server().target(), token);
}

std::string NodeTest::DeviceOf(const std::string& name) {
  absl::StatusOr<v1::TensorInfo> info = node_->Listed(name);
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->device() : "";
}

v1::DeviceInfo NodeTest::DeviceEntry(const std::string& device) {
  absl::StatusOr<v1::ListOpsResponse> ops = node_->ListOps();
  EXPECT_TRUE(ops.ok()) << ops.status();
  if (ops.ok()) {
    for (const v1::DeviceInfo& d : ops->devices()) {
      if (d.name() == device) return d;
    }
  }
  ADD_FAILURE() << "ListOps lists no device " << device;
  return {};
}

// ---- sharding ----

std::vector<ShardSpan> ExpectedShards(int64_t rows, int n) {
  std::vector<ShardSpan> spans;
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t r = rows / n + (i < rows % n ? 1 : 0);
    if (r == 0) continue;
    spans.push_back({i, at, r});
    at += r;
  }
  return spans;
}

AssertionResult ShardedAs(const v1::TensorInfo& info, int64_t rows, uint64_t row_bytes,
                          const std::vector<std::string>& devices) {
  const std::vector<ShardSpan> want = ExpectedShards(rows, static_cast<int>(devices.size()));
  auto describe = [&] {
    std::string s;
    for (const v1::TensorShard& sh : info.shards()) {
      absl::StrAppend(&s, " {", sh.device(), " rows ", sh.row_begin(), "+", sh.rows(), ", ",
                      sh.bytes(), " bytes}");
    }
    return s;
  };
  if (info.shards_size() != static_cast<int>(want.size())) {
    return AssertionFailure() << "'" << info.name() << "' has " << info.shards_size() << " shards ("
                              << describe() << " ), expected " << want.size() << " for " << rows
                              << " rows over " << devices.size() << " devices";
  }
  std::vector<std::string> shard_devices;
  uint64_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const v1::TensorShard& got = info.shards(static_cast<int>(i));
    const std::string& device = devices.at(want[i].device);
    if (got.device() != device || got.row_begin() != want[i].row_begin ||
        got.rows() != want[i].rows || got.bytes() != want[i].rows * row_bytes) {
      return AssertionFailure() << "'" << info.name() << "' shard " << i << " is {" << got.device()
                                << " rows " << got.row_begin() << "+" << got.rows() << ", "
                                << got.bytes() << " bytes}, expected {" << device << " rows "
                                << want[i].row_begin << "+" << want[i].rows << ", "
                                << want[i].rows * row_bytes << " bytes}; all:" << describe();
    }
    shard_devices.push_back(device);
    total += got.bytes();
  }
  if (info.device() != absl::StrJoin(shard_devices, ",")) {
    return AssertionFailure() << "'" << info.name() << "' device \"" << info.device()
                              << "\", expected \"" << absl::StrJoin(shard_devices, ",") << "\"";
  }
  if (info.bytes() != total) {
    return AssertionFailure() << "'" << info.name() << "' bytes " << info.bytes()
                              << ", its shards hold " << total;
  }
  return AssertionSuccess();
}

// ---- data and the reference ----

client::HostTensor RandomValues(v1::DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  client::HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const uint64_t n = client::ElementCount(t.shape).value_or(0);
  t.data.resize(n * client::DTypeSize(dtype));
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int32_t> integer(-1000, 1000);
  for (uint64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case v1::FLOAT32:
        reinterpret_cast<float*>(t.data.data())[i] = real(rng);
        break;
      case v1::BFLOAT16:
        reinterpret_cast<uint16_t*>(t.data.data())[i] = op_util::FloatToBf16(real(rng));
        break;
      case v1::INT32:
        reinterpret_cast<int32_t*>(t.data.data())[i] = integer(rng);
        break;
      case v1::INT64:
        reinterpret_cast<int64_t*>(t.data.data())[i] = integer(rng);
        break;
      default:
        break;
    }
  }
  return t;
}

uint64_t Bytes(const client::HostTensor& t) { return t.data.size(); }

absl::StatusOr<client::HostTensor> Reference(const std::string& op,
                                             const std::vector<client::HostTensor>& inputs) {
  const OpSpec* spec = FindOp(op);
  const AlgoSpec* row = CpuReference(op);
  if (spec == nullptr || row == nullptr) {
    return absl::NotFoundError(absl::StrCat("the op table has no CPU reference of '", op, "'"));
  }
  std::vector<TensorMeta> metas;
  std::vector<const void*> ptrs;
  for (const client::HostTensor& t : inputs) {
    metas.push_back({static_cast<DType>(t.dtype), t.shape});
    ptrs.push_back(t.data.data());
  }
  absl::StatusOr<TensorMeta> out_meta = spec->infer(metas);
  if (!out_meta.ok()) return out_meta.status();
  client::HostTensor out;
  out.dtype = static_cast<v1::DType>(out_meta->dtype);
  out.shape = out_meta->shape;
  out.data.resize(out_meta->Bytes());
  HostKernelEnv env;
  AttrMap attrs;
  KernelArgs args{ptrs, metas, out.data.data(), *out_meta, attrs, env};
  if (absl::Status s = row->run(args); !s.ok()) return s;
  return out;
}

AssertionResult MatchesReference(const std::string& op,
                                 const std::vector<client::HostTensor>& inputs,
                                 const client::HostTensor& got, const std::string& algorithm) {
  absl::StatusOr<client::HostTensor> want = Reference(op, inputs);
  if (!want.ok()) return AssertionFailure() << "reference of " << op << ": " << want.status();
  if (got.dtype != want->dtype || got.shape != want->shape) {
    return AssertionFailure() << op << " gave " << client::DTypeName(got.dtype)
                              << client::ShapeString(got.shape) << ", expected "
                              << client::DTypeName(want->dtype) << client::ShapeString(want->shape);
  }
  if (got.data.size() != want->data.size()) {
    return AssertionFailure() << op << " gave " << got.data.size() << " bytes, expected "
                              << want->data.size();
  }
  std::vector<TensorMeta> metas;
  std::vector<const void*> ptrs;
  for (const client::HostTensor& t : inputs) {
    metas.push_back({static_cast<DType>(t.dtype), t.shape});
    ptrs.push_back(t.data.data());
  }
  const TensorMeta out_meta{static_cast<DType>(want->dtype), want->shape};
  const OpResult result{*FindOp(op), metas, ptrs, out_meta, got.data.data(), want->data.data()};
  if (absl::Status s = CheckResult(result, algorithm); !s.ok()) {
    return AssertionFailure() << op << " (algorithm '" << algorithm
                              << "') against the CPU reference: " << s.message();
  }
  return AssertionSuccess();
}

AssertionResult MatchesReference(const std::string& op,
                                 const std::vector<client::HostTensor>& inputs,
                                 const v1::Tensor& got, const std::string& algorithm) {
  absl::StatusOr<client::HostTensor> host = client::FromProto(got);
  if (!host.ok()) return AssertionFailure() << "the returned tensor: " << host.status();
  return MatchesReference(op, inputs, *host, algorithm);
}

v1::Tensor Output(const v1::ExecuteResponse& resp, const std::string& id) {
  for (const v1::NamedTensor& t : resp.outputs()) {
    if (t.node() == id) return t.tensor();
  }
  ADD_FAILURE() << "no returned output of node '" << id << "'";
  return {};
}

v1::NodeResult NodeReport(const v1::ExecuteResponse& resp, const std::string& id) {
  for (const v1::NodeResult& r : resp.nodes()) {
    if (r.id() == id) return r;
  }
  ADD_FAILURE() << "no NodeResult of node '" << id << "'";
  return {};
}

v1::ExecuteRequest OneNode(const std::string& op, const std::vector<In>& inputs,
                           const std::string& store_as) {
  v1::ExecuteRequest r;
  AddNode(r, "n", op, inputs);
  AddOutput(r, "n", /*return_inline=*/true, store_as);
  return r;
}

}  // namespace opserve::e2e
