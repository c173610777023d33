#include "fake_opserve.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "opserve/v1/opserve.grpc.pb.h"

namespace opserve::testing {
namespace {

uint64_t ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
    case v1::INT32:
      return 4;
    case v1::INT64:
      return 8;
    case v1::BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

}  // namespace

struct FakeServer::Service final : v1::OpServe::Service {
  struct Stored {
    v1::TensorInfo info;
    std::shared_ptr<const std::string> data;  // shared with downloads in progress
  };

  std::map<std::string, std::string> required_metadata;
  bool reuse_buffers = false;
  GetStream get_stream = GetStream::kCorrect;
  std::mutex mu;
  std::map<std::string, Stored> tensors;
  std::vector<std::shared_ptr<const std::string>> spare;  // reuse_buffers: freed buffers

  // A buffer for `bytes`: a spare one no download still reads when reusing, else a fresh one.
  std::shared_ptr<std::string> NewBuffer(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = spare.begin(); it != spare.end(); ++it) {
      if (it->use_count() == 1 && (*it)->capacity() >= bytes) {
        auto buffer = std::const_pointer_cast<std::string>(*it);
        spare.erase(it);
        buffer->clear();  // keeps the capacity, and so the mapped pages
        return buffer;
      }
    }
    auto buffer = std::make_shared<std::string>();
    buffer->reserve(bytes);
    return buffer;
  }
  void Release(std::shared_ptr<const std::string> data) {  // with mu held
    if (reuse_buffers && data) spare.push_back(std::move(data));
  }

  grpc::Status CheckToken(grpc::ServerContext* context) {
    const auto& metadata = context->client_metadata();
    for (const auto& [key, value] : required_metadata) {
      auto it = metadata.find(key);
      if (it == metadata.end() || std::string(it->second.data(), it->second.size()) != value) {
        return {grpc::StatusCode::UNAUTHENTICATED, "missing or wrong " + key};
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status PutTensor(grpc::ServerContext* context,
                         grpc::ServerReader<v1::PutTensorRequest>* reader,
                         v1::PutTensorResponse* response) override {
    if (grpc::Status s = CheckToken(context); !s.ok()) return s;
    v1::PutTensorRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "the first message must be the header"};
    }
    const v1::PutTensorHeader header = message.header();
    uint64_t bytes = ElementSize(header.dtype());
    if (bytes == 0) return {grpc::StatusCode::INVALID_ARGUMENT, "bad dtype"};
    for (int64_t dim : header.shape()) bytes *= static_cast<uint64_t>(dim);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (tensors.count(header.name()) && !header.overwrite()) {
        // Answers before reading the chunks, as a real server may: the client must cope.
        return {grpc::StatusCode::ALREADY_EXISTS, "tensor '" + header.name() + "' exists"};
      }
    }
    Stored stored;
    std::shared_ptr<std::string> data = NewBuffer(bytes);
    while (reader->Read(&message)) {
      if (!message.has_chunk()) return {grpc::StatusCode::INVALID_ARGUMENT, "a second header"};
      if (message.chunk().size() > bytes - data->size()) {
        return {grpc::StatusCode::INVALID_ARGUMENT, "more data than the shape holds"};
      }
      *data += message.chunk();
    }
    stored.data = std::move(data);
    if (stored.data->size() != bytes) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "less data than the shape holds"};
    }
    stored.info.set_name(header.name());
    stored.info.set_dtype(header.dtype());
    *stored.info.mutable_shape() = header.shape();
    stored.info.set_bytes(bytes);
    stored.info.set_device("fake");
    *response->mutable_info() = stored.info;
    std::lock_guard<std::mutex> lock(mu);
    Stored& slot = tensors[header.name()];
    Release(std::move(slot.data));
    slot = std::move(stored);
    return grpc::Status::OK;
  }

  grpc::Status GetTensor(grpc::ServerContext* context, const v1::GetTensorRequest* request,
                         grpc::ServerWriter<v1::GetTensorResponse>* writer) override {
    if (grpc::Status s = CheckToken(context); !s.ok()) return s;
    // A reference, taken under the lock: a concurrent overwrite replaces it, never tears it.
    Stored stored;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = tensors.find(request->name());
      if (it == tensors.end()) {
        return {grpc::StatusCode::NOT_FOUND, "no tensor '" + request->name() + "'"};
      }
      stored = it->second;
    }
    if (get_stream != GetStream::kCorrect) return MalformedGet(stored, writer);
    v1::GetTensorResponse message;
    *message.mutable_info() = stored.info;
    if (!writer->Write(message)) return {grpc::StatusCode::CANCELLED, "client went away"};
    const size_t chunk = request->chunk_bytes() ? request->chunk_bytes() : (1 << 20);
    for (size_t offset = 0; offset < stored.data->size(); offset += chunk) {
      message.set_chunk(stored.data->data() + offset,
                        std::min(chunk, stored.data->size() - offset));
      if (!writer->Write(message)) return {grpc::StatusCode::CANCELLED, "client went away"};
    }
    return grpc::Status::OK;
  }

  // The malformed streams of GetStream; each ends with OK, as a server that believes it did
  // right would.
  grpc::Status MalformedGet(const Stored& stored, grpc::ServerWriter<v1::GetTensorResponse>* writer) {
    v1::GetTensorResponse info;
    *info.mutable_info() = stored.info;
    v1::GetTensorResponse data;
    data.set_chunk(*stored.data);
    switch (get_stream) {
      case GetStream::kCorrect:
        break;
      case GetStream::kChunkBeforeInfo:
        writer->Write(data);
        writer->Write(info);
        break;
      case GetStream::kMoreThanAnnounced:
        data.mutable_chunk()->push_back('!');
        writer->Write(info);
        writer->Write(data);
        break;
      case GetStream::kFewerThanAnnounced:
        data.mutable_chunk()->pop_back();
        writer->Write(info);
        writer->Write(data);
        break;
      case GetStream::kInconsistentInfo:
        info.mutable_info()->set_bytes(stored.info.bytes() + 4);
        writer->Write(info);
        writer->Write(data);
        break;
      case GetStream::kTwoInfos:
        writer->Write(info);
        writer->Write(info);
        writer->Write(data);
        break;
      case GetStream::kHugeAnnounced:
        info.mutable_info()->set_dtype(v1::INT64);
        info.mutable_info()->clear_shape();
        info.mutable_info()->add_shape(int64_t{1} << 59);
        info.mutable_info()->set_bytes(uint64_t{1} << 62);
        writer->Write(info);
        break;
    }
    return grpc::Status::OK;
  }

  grpc::Status DeleteTensor(grpc::ServerContext* context, const v1::DeleteTensorRequest* request,
                            v1::DeleteTensorResponse* response) override {
    if (grpc::Status s = CheckToken(context); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu);
    auto it = tensors.find(request->name());
    if (it == tensors.end())
      return {grpc::StatusCode::NOT_FOUND, "no tensor '" + request->name() + "'"};
    *response->mutable_info() = it->second.info;
    Release(std::move(it->second.data));
    tensors.erase(it);
    return grpc::Status::OK;
  }

  grpc::Status ListTensors(grpc::ServerContext* context, const v1::ListTensorsRequest*,
                           v1::ListTensorsResponse* response) override {
    if (grpc::Status s = CheckToken(context); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [name, stored] : tensors) *response->add_tensors() = stored.info;
    return grpc::Status::OK;
  }

  // The echo: each node reports op "fake" timings; each inline tensor comes back as an output
  // named after it. A node with op "sleep" sleeps attrs["ms"] milliseconds (deadline tests).
  grpc::Status Execute(grpc::ServerContext* context, const v1::ExecuteRequest* request,
                       v1::ExecuteResponse* response) override {
    if (grpc::Status s = CheckToken(context); !s.ok()) return s;
    for (const v1::Node& node : request->nodes()) {
      if (node.op() == "sleep") {
        auto ms = node.attrs().find("ms");
        std::this_thread::sleep_for(
            std::chrono::milliseconds(ms == node.attrs().end() ? 0 : ms->second.i()));
      }
      v1::NodeResult* result = response->add_nodes();
      result->set_id(node.id());
      result->set_op(node.op());
      result->set_algorithm("fake");
      result->set_kernel_us(1.5);
    }
    for (const auto& [name, tensor] : request->inline_tensors()) {
      v1::NamedTensor* output = response->add_outputs();
      output->set_node(name);
      *output->mutable_tensor() = tensor;
    }
    response->set_device("fake");
    response->mutable_timing()->set_total_us(10);
    return grpc::Status::OK;
  }

  grpc::Status ListOps(grpc::ServerContext* context, const v1::ListOpsRequest*,
                       v1::ListOpsResponse* response) override {
    if (grpc::Status s = CheckToken(context); !s.ok()) return s;
    response->set_backend("fake");
    response->set_device("fake");
    v1::OpInfo* op = response->add_ops();
    op->set_name("sum");
    op->add_dtypes(v1::FLOAT32);
    op->set_default_algorithm("serial");
    v1::AlgorithmInfo* algorithm = op->add_algorithms();
    algorithm->set_name("serial");
    algorithm->add_dtypes(v1::FLOAT32);
    algorithm->set_deterministic(true);
    algorithm->set_is_default(true);
    return grpc::Status::OK;
  }
};

std::unique_ptr<FakeServer> FakeServer::Start(const FakeServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<FakeServer> fake(new FakeServer);
  fake->service_ = std::make_unique<Service>();
  fake->service_->required_metadata = options.required_metadata;
  fake->service_->reuse_buffers = options.reuse_buffers;
  fake->service_->get_stream = options.get_stream;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &fake->port_);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  for (const auto& [key, value] : options.channel_args) builder.AddChannelArgument(key, value);
  builder.RegisterService(fake->service_.get());
  fake->server_ = builder.BuildAndStart();
  if (!fake->server_ || fake->port_ == 0) return nullptr;
  return fake;
}

FakeServer::~FakeServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace opserve::testing
