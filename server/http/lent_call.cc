#include "server/http/lent_call.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/impl/codegen/proto_utils.h>  // SerializationTraits of protobuf messages
#include <grpcpp/support/byte_buffer.h>

#include <condition_variable>
#include <mutex>
#include <vector>

namespace opserve::http {
namespace {

namespace pb = google::protobuf;
using pb::internal::WireFormatLite;

constexpr char kModelInferMethod[] = "/inference.GRPCInferenceService/ModelInfer";
constexpr uint32_t kRawInputTag =
    WireFormatLite::MakeTag(inference::ModelInferRequest::kRawInputContentsFieldNumber,
                            WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// The slices of one call that borrow the request's memory, and the wait for gRPC to give them
// back: nothing in gRPC's API promises that a call releases its message's slices before it
// completes, so each carries a release callback and the call waits for all of them.
class Loans {
 public:
  grpc::Slice Lend(std::string_view bytes) {
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

grpc::Status LentModelInfer(grpc::GenericStub& stub, grpc::ClientContext* ctx,
                            const InferHttpRequest& request,
                            inference::ModelInferResponse* response) {
  grpc::Status status;
  grpc::ByteBuffer reply;
  Loans loans;
  {
    std::vector<grpc::Slice> slices;
    slices.emplace_back(request.message.SerializeAsString());
    for (const RawInput& raw : request.raw) {
      uint8_t prefix[16];
      uint8_t* end = pb::io::CodedOutputStream::WriteVarint32ToArray(kRawInputTag, prefix);
      end = pb::io::CodedOutputStream::WriteVarint64ToArray(raw.bytes, end);
      slices.emplace_back(prefix, static_cast<size_t>(end - prefix));
      for (std::string_view piece : raw.pieces) {
        if (!piece.empty()) slices.push_back(loans.Lend(piece));
      }
    }
    grpc::ByteBuffer message(slices.data(), slices.size());
    slices.clear();
    grpc::CompletionQueue cq;
    {
      std::unique_ptr<grpc::GenericClientAsyncResponseReader> rpc =
          stub.PrepareUnaryCall(ctx, kModelInferMethod, message, &cq);
      rpc->StartCall();
      rpc->Finish(&reply, &status, nullptr);
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
  loans.WaitForAll();
  if (!status.ok()) return status;
  return grpc::SerializationTraits<inference::ModelInferResponse>::Deserialize(&reply, response);
}

}  // namespace opserve::http
