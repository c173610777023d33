#include "client/opserve_client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "common/status_macros.h"  // header only: the macros, no link to opserve_core

namespace opserve::client {
namespace {

namespace pb = google::protobuf;
using WireFormatLite = pb::internal::WireFormatLite;

// A download's destination is fresh memory, and first-touch page faults bound the download
// (client/TUNING.md). Asking for transparent huge pages on it (the kernel's "madvise" mode, the
// default of Debian and Ubuntu) takes a 2 MiB page per fault instead of 4 KiB. Advice only:
// where THP is off or the range is too small, nothing changes.
constexpr uint64_t kHugePageAdviceMinBytes = 8ull << 20;

void AdviseHugePages(const char* data, uint64_t bytes) {
  if (bytes < kHugePageAdviceMinBytes) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

constexpr char kPutTensorMethod[] = "/opserve.v1.OpServe/PutTensor";
constexpr char kGetTensorMethod[] = "/opserve.v1.OpServe/GetTensor";
// The standard health service. Its two messages are hand-encoded (one optional field each)
// rather than generated, so a binary that also links the server's copy of health.proto cannot
// hit protobuf's duplicate-descriptor abort.
constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";
constexpr uint32_t kHealthStatusField = 1;  // HealthCheckResponse.status
constexpr int kHealthServing = 1;           // ServingStatus.SERVING

// Flow control for downloads: the receiver's per-stream window. gRPC's BDP probe grows it from
// 64 KiB, but starting large lets a GetTensor run at full speed from its first chunk.
constexpr int kStreamLookaheadBytes = 64 << 20;
constexpr int64_t kMaxChunkBytes = 1 << 30;
// PutTensorRequest.chunk and GetTensorResponse.chunk are both field 2, length-delimited.
constexpr uint32_t kChunkTag =
    WireFormatLite::MakeTag(2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
static_assert(v1::PutTensorRequest::kChunkFieldNumber == 2);
static_assert(v1::GetTensorResponse::kChunkFieldNumber == 2);

// Drives one generic streaming call on a private completion queue. A stream allows one
// outstanding read and one outstanding write, and these calls never overlap them, so each
// operation simply waits for its own completion.
//
// With an idle timeout, an operation that does not complete in time cancels the call; the
// operation then completes at once, failed, and stalled() tells the caller why.
class BlockingStream {
 public:
  BlockingStream(grpc::GenericStub* stub, grpc::ClientContext* context, const std::string& method,
                 std::optional<absl::Duration> idle_timeout = std::nullopt)
      : context_(context),
        idle_timeout_(idle_timeout),
        call_(stub->PrepareCall(context, method, &cq_)) {}
  ~BlockingStream() {
    call_.reset();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  bool Start() {
    call_->StartCall(this);
    return Wait();
  }
  bool Write(const grpc::ByteBuffer& buffer) {
    call_->Write(buffer, this);
    return Wait();
  }
  bool WritesDone() {
    call_->WritesDone(this);
    return Wait();
  }
  bool Read(grpc::ByteBuffer* buffer) {
    call_->Read(buffer, this);
    return Wait();
  }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, this);
    Wait();
    return status;
  }

  bool stalled() const { return stalled_; }

 private:
  bool Wait() {
    void* tag;
    bool ok = false;
    if (idle_timeout_.has_value() && !stalled_) {
      const auto deadline = absl::ToChronoTime(absl::Now() + *idle_timeout_);
      switch (cq_.AsyncNext(&tag, &ok, deadline)) {
        case grpc::CompletionQueue::GOT_EVENT: return ok;
        case grpc::CompletionQueue::SHUTDOWN: return false;
        case grpc::CompletionQueue::TIMEOUT:
          stalled_ = true;
          context_->TryCancel();
          break;
      }
    }
    return cq_.Next(&tag, &ok) && ok;
  }

  grpc::ClientContext* context_;
  std::optional<absl::Duration> idle_timeout_;
  bool stalled_ = false;
  grpc::CompletionQueue cq_;  // declared before call_: call_ is prepared on it
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

grpc::ByteBuffer BufferOf(const pb::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseBuffer(grpc::ByteBuffer* buffer, pb::Message* message) {
  grpc::Status status = grpc::SerializationTraits<pb::Message>::Deserialize(buffer, message);
  return ToAbslStatus(status);
}

// A chunk message: its tag and length prefix, then the payload copied once from `data` into a
// slice the transport owns, so nothing refers to the caller's buffer after the call returns.
grpc::ByteBuffer ChunkBuffer(const char* data, size_t bytes) {
  uint8_t prefix[16];
  uint8_t* end = pb::io::CodedOutputStream::WriteVarint32ToArray(kChunkTag, prefix);
  end = pb::io::CodedOutputStream::WriteVarint64ToArray(bytes, end);
  grpc::Slice slices[2] = {grpc::Slice(prefix, static_cast<size_t>(end - prefix)),
                           grpc::Slice(data, bytes)};
  return grpc::ByteBuffer(slices, 2);
}

// Appends the payload of a message holding only `chunk` straight from its slices to `dest`,
// whose capacity was reserved for `limit` bytes. Returns false, copying nothing, for any other
// message: the caller parses those with protobuf instead.
absl::StatusOr<bool> AppendChunk(const grpc::ByteBuffer& buffer, std::string* dest,
                                 uint64_t limit) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  // The tag and length occupy at most 1 + 10 bytes at the front, possibly over several slices.
  uint8_t head[11];
  size_t head_bytes = 0;
  for (const grpc::Slice& slice : slices) {
    const size_t take = std::min(sizeof(head) - head_bytes, slice.size());
    std::memcpy(head + head_bytes, slice.begin(), take);
    head_bytes += take;
    if (head_bytes == sizeof(head)) break;
  }
  pb::io::CodedInputStream in(head, static_cast<int>(head_bytes));
  uint64_t length = 0;
  if (in.ReadTag() != kChunkTag || !in.ReadVarint64(&length)) return false;
  size_t skip = static_cast<size_t>(in.CurrentPosition());
  if (skip + length != buffer.Length()) return false;  // other fields too: let protobuf parse
  if (length > limit - dest->size()) {
    return absl::DataLossError(
        absl::StrCat("the server sent more than the ", limit, " bytes it announced"));
  }
  for (const grpc::Slice& slice : slices) {
    if (skip >= slice.size()) {
      skip -= slice.size();
      continue;
    }
    dest->append(reinterpret_cast<const char*>(slice.begin()) + skip, slice.size() - skip);
    skip = 0;
  }
  return true;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", what, " file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(
    const ClientOptions& options) {
  if (options.root_ca_path.empty()) {
    if (!options.client_cert_path.empty() || !options.client_key_path.empty()) {
      return absl::InvalidArgumentError("a client certificate needs a root CA (TLS)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.root_ca_path, "root CA"));
  if (options.client_cert_path.empty() != options.client_key_path.empty()) {
    return absl::InvalidArgumentError("mutual TLS needs both a client certificate and its key");
  }
  if (!options.client_cert_path.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFile(options.client_cert_path, "client certificate"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFile(options.client_key_path, "client key"));
  }
  return grpc::SslCredentials(ssl);
}

// The status of a finished stream: a stall the stream itself cancelled reads as the deadline
// it is, not as the CANCELLED gRPC reports for it.
absl::Status StreamStatus(const BlockingStream& stream, const grpc::Status& status,
                          absl::string_view call, absl::string_view name,
                          std::optional<absl::Duration> idle_timeout) {
  if (stream.stalled() && !status.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(call, " '", name, "': nothing moved for ",
                                                    absl::FormatDuration(*idle_timeout),
                                                    " (the server does not answer)"));
  }
  return ToAbslStatus(status);
}

}  // namespace

std::string NewSessionId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

absl::Status ToAbslStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // grpc::StatusCode and absl::StatusCode share their numbering.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("no target given");
  if (options.chunk_bytes <= 0 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes must be in [1, ", kMaxChunkBytes,
                                                   "], got ", options.chunk_bytes));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_message_bytes must be positive");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, Credentials(options));
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamLookaheadBytes);
  for (const auto& [key, value] : options.channel_args) args.SetInt(key, value);
  return std::unique_ptr<Client>(
      new Client(options, grpc::CreateCustomChannel(options.target, credentials, args)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::OpServe::NewStub(channel_)),
      generic_(channel_) {}

void Client::Prepare(grpc::ClientContext* context, const CallOptions& call) const {
  const absl::Duration timeout = call.timeout.value_or(options_.timeout);
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  context->set_wait_for_ready(options_.wait_for_ready);
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.bearer_token));
  }
  if (!options_.session.empty()) context->AddMetadata("x-opserve-session", options_.session);
}

absl::StatusOr<bool> Client::HealthServing(const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(&context, call);
  BlockingStream stream(&generic_, &context, kHealthCheckMethod);
  // An empty HealthCheckRequest (service "") asks about the server as a whole.
  grpc::Slice empty;
  grpc::ByteBuffer response;
  bool got = stream.Start() && stream.Write(grpc::ByteBuffer(&empty, 1)) && stream.WritesDone() &&
             stream.Read(&response);
  RETURN_IF_ERROR(ToAbslStatus(stream.Finish()));
  if (!got) return absl::InternalError("Health/Check ended without a response");

  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) bytes.append(slice.begin(), slice.end());
  }
  pb::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                              static_cast<int>(bytes.size()));
  int status = 0;  // an absent field is UNKNOWN
  while (uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == kHealthStatusField &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint32_t value = 0;
      if (!in.ReadVarint32(&value)) break;
      status = static_cast<int>(value);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return absl::InternalError("malformed HealthCheckResponse");
    }
  }
  return status == kHealthServing;
}

absl::StatusOr<v1::ListOpsResponse> Client::ListOps(const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(&context, call);
  v1::ListOpsResponse response;
  RETURN_IF_ERROR(ToAbslStatus(stub_->ListOps(&context, v1::ListOpsRequest(), &response)));
  return response;
}

absl::StatusOr<v1::TensorInfo> Client::PutTensor(absl::string_view name, v1::DType dtype,
                                                 absl::Span<const int64_t> shape, const void* data,
                                                 uint64_t bytes, bool overwrite,
                                                 const CallOptions& call) {
  return PutTensor(name, dtype, shape, data, bytes, overwrite, Placement{}, call);
}

absl::StatusOr<v1::TensorInfo> Client::PutTensor(absl::string_view name, v1::DType dtype,
                                                 absl::Span<const int64_t> shape, const void* data,
                                                 uint64_t bytes, bool overwrite,
                                                 const Placement& placement,
                                                 const CallOptions& call) {
  if (name.empty()) return absl::InvalidArgumentError("PutTensor: empty tensor name");
  absl::StatusOr<uint64_t> expected = ByteSize(dtype, shape);
  if (!expected.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PutTensor '", name, "': ", expected.status().message()));
  }
  if (*expected != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("PutTensor '", name, "': ", DTypeName(dtype),
                                                   ShapeString(shape), " needs ", *expected,
                                                   " bytes, given ", bytes));
  }

  v1::PutTensorRequest header;
  header.mutable_header()->set_name(std::string(name));
  header.mutable_header()->set_dtype(dtype);
  header.mutable_header()->mutable_shape()->Add(shape.begin(), shape.end());
  header.mutable_header()->set_overwrite(overwrite);
  header.mutable_header()->set_device(placement.device);
  header.mutable_header()->set_shard(placement.shard);

  grpc::ClientContext context;
  Prepare(&context, call);
  BlockingStream stream(&generic_, &context, kPutTensorMethod, call.idle_timeout);
  // A failed write means the server ended the call early (a name clash, say): Finish says why.
  bool sent = stream.Start() && stream.Write(BufferOf(header));
  if (call.progress) call.progress(0, bytes);
  const char* begin = static_cast<const char*>(data);
  const uint64_t chunk = static_cast<uint64_t>(options_.chunk_bytes);
  for (uint64_t offset = 0; sent && offset < bytes; offset += chunk) {
    const uint64_t length = std::min(chunk, bytes - offset);
    sent = stream.Write(ChunkBuffer(begin + offset, length));
    if (sent && call.progress) call.progress(offset + length, bytes);
  }
  grpc::ByteBuffer reply;
  const bool got = sent && stream.WritesDone() && stream.Read(&reply);
  RETURN_IF_ERROR(StreamStatus(stream, stream.Finish(), "PutTensor", name, call.idle_timeout));
  if (!got) return absl::InternalError("PutTensor ended without a response");
  v1::PutTensorResponse response;
  RETURN_IF_ERROR(ParseBuffer(&reply, &response));
  return std::move(*response.mutable_info());
}

absl::StatusOr<v1::TensorInfo> Client::PutTensor(absl::string_view name, const HostTensor& tensor,
                                                 bool overwrite, const Placement& placement,
                                                 const CallOptions& call) {
  return PutTensor(name, tensor.dtype, tensor.shape, tensor.data.data(), tensor.data.size(),
                   overwrite, placement, call);
}

absl::StatusOr<v1::TensorInfo> Client::PutTensor(absl::string_view name, const HostTensor& tensor,
                                                 bool overwrite, const CallOptions& call) {
  return PutTensor(name, tensor, overwrite, Placement{}, call);
}

absl::StatusOr<HostTensor> Client::GetTensor(absl::string_view name, const CallOptions& call) {
  v1::GetTensorRequest request;
  request.set_name(std::string(name));
  request.set_chunk_bytes(static_cast<uint32_t>(options_.chunk_bytes));

  grpc::ClientContext context;
  Prepare(&context, call);
  BlockingStream stream(&generic_, &context, kGetTensorMethod, call.idle_timeout);
  bool ok = stream.Start() && stream.Write(BufferOf(request)) && stream.WritesDone();

  HostTensor tensor;
  bool have_info = false;
  uint64_t expected = 0;
  absl::Status problem;  // a malformed stream; the call is still finished before returning
  grpc::ByteBuffer buffer;
  while (ok && problem.ok() && stream.Read(&buffer)) {
    if (have_info) {
      absl::StatusOr<bool> copied = AppendChunk(buffer, &tensor.data, expected);
      if (!copied.ok()) {
        problem = copied.status();
        break;
      }
      if (*copied) {
        if (call.progress) call.progress(tensor.data.size(), expected);
        continue;
      }
    }
    v1::GetTensorResponse message;
    problem = ParseBuffer(&buffer, &message);
    if (!problem.ok()) break;
    if (message.has_info() && !have_info) {
      const v1::TensorInfo& info = message.info();
      tensor.dtype = info.dtype();
      tensor.shape.assign(info.shape().begin(), info.shape().end());
      absl::StatusOr<uint64_t> bytes = ByteSize(tensor.dtype, tensor.shape);
      if (!bytes.ok() || *bytes != info.bytes()) {
        problem = absl::DataLossError(absl::StrCat("GetTensor '", name, "': the server's info (",
                                                   info.ShortDebugString(), ") is inconsistent"));
        break;
      }
      expected = *bytes;
      // A size past this machine's memory can only fail: refuse it before asking the allocator
      // (under AddressSanitizer an oversized operator new aborts instead of throwing).
      const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
      if (expected > physical) {
        problem = absl::ResourceExhaustedError(absl::StrCat(
            "GetTensor '", name, "': cannot allocate ", expected, " bytes, over this machine's memory (", physical,
            " bytes)"));
        break;
      }
      // Reserved, not resized: each page is first touched by the copy of its chunk, so the page
      // faults of a fresh multi-GiB buffer overlap the transfer instead of preceding it.
      try {
        tensor.data.reserve(expected);
      } catch (const std::exception&) {  // std::bad_alloc, std::length_error
        problem = absl::ResourceExhaustedError(absl::StrCat(
            "GetTensor '", name, "': cannot allocate ", expected, " bytes on the client"));
        break;
      }
      AdviseHugePages(tensor.data.data(), expected);
      have_info = true;
      if (call.progress) call.progress(0, expected);
    } else if (message.has_chunk() && have_info) {
      // A chunk message with extra fields: protobuf already copied it, copy it once more.
      if (message.chunk().size() > expected - tensor.data.size()) {
        problem = absl::DataLossError("the server sent more bytes than it announced");
        break;
      }
      tensor.data += message.chunk();
      if (call.progress) call.progress(tensor.data.size(), expected);
    } else {
      problem = absl::DataLossError(
          absl::StrCat("GetTensor '", name, "': expected the info first, then chunks"));
      break;
    }
  }
  if (!problem.ok()) context.TryCancel();
  absl::Status status =
      StreamStatus(stream, stream.Finish(), "GetTensor", name, call.idle_timeout);
  if (!problem.ok()) return problem;
  RETURN_IF_ERROR(status);
  if (!have_info) return absl::DataLossError(absl::StrCat("GetTensor '", name, "': no info"));
  if (tensor.data.size() != expected) {
    return absl::DataLossError(absl::StrCat("GetTensor '", name, "': received ", tensor.data.size(),
                                            " of ", expected, " bytes"));
  }
  return tensor;
}

absl::StatusOr<v1::TensorInfo> Client::DeleteTensor(absl::string_view name,
                                                    const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(&context, call);
  v1::DeleteTensorRequest request;
  request.set_name(std::string(name));
  v1::DeleteTensorResponse response;
  RETURN_IF_ERROR(ToAbslStatus(stub_->DeleteTensor(&context, request, &response)));
  return std::move(*response.mutable_info());
}

absl::StatusOr<std::vector<v1::TensorInfo>> Client::ListTensors(const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(&context, call);
  v1::ListTensorsResponse response;
  RETURN_IF_ERROR(ToAbslStatus(stub_->ListTensors(&context, v1::ListTensorsRequest(), &response)));
  return std::vector<v1::TensorInfo>(std::make_move_iterator(response.mutable_tensors()->begin()),
                                     std::make_move_iterator(response.mutable_tensors()->end()));
}

absl::StatusOr<v1::MoveTensorResponse> Client::MoveTensor(absl::string_view name,
                                                          absl::string_view device,
                                                          const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(&context, call);
  v1::MoveTensorRequest request;
  request.set_name(std::string(name));
  request.set_device(std::string(device));
  v1::MoveTensorResponse response;
  RETURN_IF_ERROR(ToAbslStatus(stub_->MoveTensor(&context, request, &response)));
  return response;
}

absl::StatusOr<v1::ExecuteResponse> Client::Execute(const v1::ExecuteRequest& request,
                                                    const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(&context, call);
  v1::ExecuteResponse response;
  RETURN_IF_ERROR(ToAbslStatus(stub_->Execute(&context, request, &response)));
  return response;
}

std::unique_ptr<grpc::ClientReaderWriter<v1::ExecuteStreamRequest, v1::ExecuteStreamResponse>>
Client::ExecuteStream(grpc::ClientContext* context, const CallOptions& call) {
  Prepare(context, call);
  return stub_->ExecuteStream(context);
}

}  // namespace opserve::client
