// A small synchronous client for the opserve API, shared by the CLI and the tests.
//
// Every call returns absl::Status / absl::StatusOr; a gRPC failure keeps its code (the numbering
// is the same) and message. Tensors move in chunks: one proto `bytes` field cannot exceed 2 GiB,
// and chunks keep each message within the server's receive limit.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/host_tensor.h"
#include "grpcpp/channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "inference/grpc_service.pb.h"
#include "opserve/v1/opserve.grpc.pb.h"

namespace opserve::client {

// Chunk payload per PutTensor/GetTensor message, measured over loopback (client/TUNING.md):
// 4 MiB less one page. With its few bytes of framing it stays under gRPC's default 4 MiB receive
// limit, so a server that keeps the default still accepts every chunk.
inline constexpr int64_t kDefaultChunkBytes = (4 << 20) - 4096;

// A session id no other client will draw: 128 random bits as 32 hex digits.
std::string NewSessionId();

struct ClientOptions {
  std::string target = "127.0.0.1:50051";  // host:port, or any gRPC target URI
  // Sent as "authorization: Bearer <token>" on every call when not empty.
  std::string bearer_token;
  // Sent as "x-opserve-session: <id>" on every call when not empty: a proxy hashes it to keep a
  // session's calls, and so its stored tensors, on one replica (docs/DEPLOY.md). NewSessionId()
  // draws one.
  std::string session;
  // TLS: a root CA turns it on; a client certificate and key add mutual TLS. PEM file paths.
  std::string root_ca_path;
  std::string client_cert_path;
  std::string client_key_path;
  int64_t chunk_bytes = kDefaultChunkBytes;
  int max_message_bytes = std::numeric_limits<int>::max();  // Execute may return big tensors
  absl::Duration timeout = absl::InfiniteDuration();        // default deadline of each call
  // Calls wait (up to their deadline) for the channel to connect instead of failing at once
  // with UNAVAILABLE while it is reconnecting: for load generators and soak tests.
  bool wait_for_ready = false;
  // Integer channel arguments applied after the client's own, for tuning experiments,
  // e.g. {"grpc.http2.lookahead_bytes", 1 << 24}.
  std::map<std::string, int> channel_args;
};

struct CallOptions {
  std::optional<absl::Duration> timeout;  // unset: ClientOptions::timeout
  // PutTensor and GetTensor through the socket: give up with DEADLINE_EXCEEDED when no message
  // moves for this long. Unlike a deadline it does not grow with the tensor, so it suits
  // transfers of any size; it also ends a call to a server that accepted and never answers.
  std::optional<absl::Duration> idle_timeout;
  // PutTensor and GetTensor through the socket: called on the caller's thread after each chunk
  // (and once with done == 0 when the size is known), with the bytes moved and the total.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Where PutTensor puts a tensor on a server of several devices (PutTensorHeader.device, .shard).
struct Placement {
  // One of the server's devices, as ListOpsResponse.devices names them ("cpu:1", "cuda:0");
  // empty: the server picks the serving device with the most free budget.
  std::string device;
  // Split a [rows, cols] tensor by rows over every serving device; `device` must then be empty.
  bool shard = false;
};

class Client {
 public:
  // Builds the channel; it connects lazily, so an unreachable server shows up as UNAVAILABLE
  // from the first call. Fails only on bad options (an unreadable TLS file, say).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // grpc.health.v1.Health/Check for the whole server: true when SERVING.
  absl::StatusOr<bool> HealthServing(const CallOptions& call = {});

  absl::StatusOr<v1::ListOpsResponse> ListOps(const CallOptions& call = {});

  // Streams a header and then the data in chunks of options().chunk_bytes. `bytes` must equal
  // product(shape) * element size; the data is read from `data` in place.
  absl::StatusOr<v1::TensorInfo> PutTensor(absl::string_view name, v1::DType dtype,
                                           absl::Span<const int64_t> shape, const void* data,
                                           uint64_t bytes, bool overwrite,
                                           const Placement& placement,
                                           const CallOptions& call = {});
  absl::StatusOr<v1::TensorInfo> PutTensor(absl::string_view name, v1::DType dtype,
                                           absl::Span<const int64_t> shape, const void* data,
                                           uint64_t bytes, bool overwrite,
                                           const CallOptions& call = {});
  absl::StatusOr<v1::TensorInfo> PutTensor(absl::string_view name, const HostTensor& tensor,
                                           bool overwrite, const Placement& placement,
                                           const CallOptions& call = {});
  absl::StatusOr<v1::TensorInfo> PutTensor(absl::string_view name, const HostTensor& tensor,
                                           bool overwrite, const CallOptions& call = {});

  // Receives the info and then the chunks straight into the returned tensor's buffer.
  absl::StatusOr<HostTensor> GetTensor(absl::string_view name, const CallOptions& call = {});

  // The same through a POSIX shared-memory object this client creates for the call, registered
  // with the server's Open Inference Protocol service (SystemSharedMemoryRegister) and named in
  // the request instead of sending bytes: for a server on the same host. The object is
  // unregistered and removed before the call returns (shm_transfer.cc).
  absl::StatusOr<v1::TensorInfo> PutTensorShm(absl::string_view name, const HostTensor& tensor,
                                              bool overwrite, const Placement& placement,
                                              const CallOptions& call = {});
  absl::StatusOr<v1::TensorInfo> PutTensorShm(absl::string_view name, const HostTensor& tensor,
                                              bool overwrite, const CallOptions& call = {});
  absl::StatusOr<HostTensor> GetTensorShm(absl::string_view name, const CallOptions& call = {});

  absl::StatusOr<v1::TensorInfo> DeleteTensor(absl::string_view name, const CallOptions& call = {});
  absl::StatusOr<std::vector<v1::TensorInfo>> ListTensors(const CallOptions& call = {});
  // Moves tensor `name` to `device` (gathering a sharded one there): where it lives now, the
  // bytes copied between devices (0: it was there already) and the server's time for it.
  absl::StatusOr<v1::MoveTensorResponse> MoveTensor(absl::string_view name,
                                                    absl::string_view device,
                                                    const CallOptions& call = {});
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request,
                                              const CallOptions& call = {});

  // The Open Inference Protocol's ModelInfer (inference.GRPCInferenceService), with raw_inputs[i]
  // sent as the i-th raw_input_contents entry straight from the caller's memory, uncopied
  // (`request` itself carries none). Returns once gRPC holds no reference to those bytes, so the
  // caller may free them then, whatever the outcome. client/model_infer.cc says why.
  absl::StatusOr<inference::ModelInferResponse> ModelInfer(
      const inference::ModelInferRequest& request, absl::Span<const absl::string_view> raw_inputs,
      const CallOptions& call = {});

  const ClientOptions& options() const { return options_; }
  // An ExecuteStream (opserve.v1's pipelined Execute), its context prepared as every call's is
  // (deadline, token, session). DriveExecuteStream (execute_stream.h) keeps one busy.
  std::unique_ptr<grpc::ClientReaderWriter<v1::ExecuteStreamRequest, v1::ExecuteStreamResponse>>
  ExecuteStream(grpc::ClientContext* context, const CallOptions& call = {});

  // The channel every call above goes through.
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  void Prepare(grpc::ClientContext* context, const CallOptions& call) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::OpServe::Stub> stub_;
  // PutTensor, GetTensor, Health and ModelInfer go through the generic stub: raw buffers let
  // chunks be built from, and received into, the caller's memory with a single copy.
  grpc::GenericStub generic_;
};

// A gRPC status as an absl::Status: same code number, same message.
absl::Status ToAbslStatus(const grpc::Status& status);

}  // namespace opserve::client
