// Client::ModelInfer: the Open Inference Protocol's ModelInfer with the inputs' bytes sent from
// the caller's memory. The generated stub would serialize the whole request, tensor bytes
// included, into fresh memory before the first byte leaves: for a 128 MiB input that is a copy
// plus a page fault per 4 KiB, which on the GPU hosts cost more than the transfer itself
// (PERFORMANCE.md, "The Open Inference Protocol"). Here the request is serialized without its tensor bytes, and each
// input's bytes follow as a raw_input_contents entry whose slice borrows the caller's buffer.
//
// The caller may free its bytes when the call returns, so the call must not return while gRPC
// still refers to them. Debian's gRPC 1.51 releases every slice of a message before the call
// completes, even when the server refuses it half-read (counted by hand against a server past its
// message limit). Nothing in its API promises that, so each borrowed slice carries a release
// callback, and the call also waits for those.
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "client/opserve_client.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"

namespace opserve::client {
namespace {

namespace pb = google::protobuf;
using pb::internal::WireFormatLite;

constexpr char kModelInferMethod[] = "/inference.GRPCInferenceService/ModelInfer";
constexpr uint32_t kRawInputTag =
    WireFormatLite::MakeTag(inference::ModelInferRequest::kRawInputContentsFieldNumber,
                            WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// The slices of one call that borrow the caller's memory, and the wait for gRPC to give them back.
class Loans {
 public:
  grpc::Slice Lend(absl::string_view bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++out_;
    }
    return grpc::Slice(const_cast<char*>(bytes.data()), bytes.size(), &Loans::Returned, this);
  }
  void WaitForAll() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return out_ == 0; });
  }

 private:
  static void Returned(void* self) {
    auto* loans = static_cast<Loans*>(self);
    std::lock_guard<std::mutex> lock(loans->mu_);
    if (--loans->out_ == 0) loans->cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int out_ = 0;
};

}  // namespace

absl::StatusOr<inference::ModelInferResponse> Client::ModelInfer(
    const inference::ModelInferRequest& request, absl::Span<const absl::string_view> raw_inputs,
    const CallOptions& call) {
  if (request.raw_input_contents_size() > 0 && !raw_inputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelInfer: the request carries ", request.raw_input_contents_size(),
        " raw_input_contents entries and ", raw_inputs.size(),
        " more were given; send one or the other"));
  }
  grpc::Status status;
  grpc::ByteBuffer reply;
  Loans loans;
  {
    std::vector<grpc::Slice> slices;
    slices.reserve(1 + 2 * raw_inputs.size());
    slices.emplace_back(request.SerializeAsString());
    for (absl::string_view bytes : raw_inputs) {
      uint8_t prefix[16];
      uint8_t* end = pb::io::CodedOutputStream::WriteVarint32ToArray(kRawInputTag, prefix);
      end = pb::io::CodedOutputStream::WriteVarint64ToArray(bytes.size(), end);
      slices.emplace_back(prefix, static_cast<size_t>(end - prefix));
      if (!bytes.empty()) slices.push_back(loans.Lend(bytes));
    }
    grpc::ByteBuffer message(slices.data(), slices.size());
    slices.clear();
    grpc::ClientContext context;
    Prepare(&context, call);
    grpc::CompletionQueue cq;
    {
      std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc =
          generic_.PrepareUnaryCall(&context, kModelInferMethod, message, &cq);
      rpc->StartCall();
      rpc->Finish(&reply, &status, this);
      void* tag;
      bool ok;
      cq.Next(&tag, &ok);
    }
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
  }
  loans.WaitForAll();  // before the caller can hear back, whatever the outcome
  if (!status.ok()) return ToAbslStatus(status);
  inference::ModelInferResponse response;
  grpc::Status parsed =
      grpc::SerializationTraits<inference::ModelInferResponse>::Deserialize(&reply, &response);
  if (!parsed.ok()) return ToAbslStatus(parsed);
  return response;
}

}  // namespace opserve::client
