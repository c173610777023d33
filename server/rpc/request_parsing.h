// Requests that do not parse reach the service as an error it can answer.
//
// gRPC 1.51's callback handlers (grpcpp/impl/codegen/server_callback_handlers.h) parse a unary or
// server-streaming request before the service sees the call; when the parse fails they never
// call the service and end the call with UNIMPLEMENTED and an empty message, which reads as "no
// such method" and is counted nowhere. A client-streaming handler reports a message that does
// not parse as a failed read, which PutTensor could not tell from the client half-closing.
// Protobuf refuses to parse wire data that is cut short or malformed, and a proto3 `string`
// field that is not valid UTF-8 (e.g. a GetTensor name of raw bytes).
//
// The service therefore registers its methods with ParsedRequest<T> as the request type instead
// of T (OpServeService::ParseRequestsInHandlers). Its SerializationTraits below never fail: they
// keep the message, or the reason it does not parse (the first string field that is not UTF-8,
// by its path, or where the wire data breaks), and the handler answers INVALID_ARGUMENT naming
// the RPC and that reason. The wire format and the generated client API do not change.
#pragma once

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/wire_format_lite.h"
#include "server/rpc/lifted_parse.h"

namespace opserve {

// gRPC parses a request on one thread, runs the handler on another and frees the request on a
// third, ordering them inside libgrpc. Debian's libgrpc is not built with ThreadSanitizer, so
// under TSan that order is invisible: every field a handler reads and every string the request
// frees is reported as a race, and a request of 200,000 nodes then takes many seconds to free.
// The parse publishes the request (PublishParsed) and each later thread takes it over
// (TakeOverParsed), stating to TSan the order gRPC provides. Without TSan both are no-ops.
#if defined(__SANITIZE_THREAD__)
#define OPSERVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OPSERVE_TSAN 1
#endif
#endif
#ifdef OPSERVE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
inline void PublishParsed(const void* request) { __tsan_release(const_cast<void*>(request)); }
inline void TakeOverParsed(const void* request) { __tsan_acquire(const_cast<void*>(request)); }
#else
inline void PublishParsed(const void*) {}
inline void TakeOverParsed(const void*) {}
#endif

// What the request log (request_log.h) reads of a received message without knowing its type.
// Every wrapper below has it at its start (first base of a single chain), since gRPC hands
// interceptors the object as a void*; every method of the two services receives one of them
// (parsed_service.h, service.h, graph_stream.h).
struct ReceivedMessage {
  uint64_t wire_bytes = 0;                           // the serialized size
  const google::protobuf::Message* proto = nullptr;  // the message, once parsed
};

// What a parsed request's large `bytes` fields became: set before the parse by the method's
// LiftingAllocator (parsed_service.h) or a stream's reader (graph_stream.h), the fields at
// `lift_path` go into blocks of `lift_pool` (lifted_parse.h), listed in `lifted`; the message
// keeps them empty. ParsedRequest's only base, so that `this` is the request's address.
struct ParsedLifts : ReceivedMessage {
  ReceivePool* lift_pool = nullptr;
  const LiftPath* lift_path = nullptr;
  // Mutable: the call gives the blocks back as soon as the device is done with them
  // (the graph calls' Reply), before the response, for the next request to reuse.
  mutable std::vector<LiftedEntry> lifted;
  void ReleaseLifted() const {
    lifted.clear();
    PublishParsed(this);  // to the destructor, on a gRPC thread (see PublishParsed)
  }
};

// A unary or server-streaming request (or one message of a graph stream), parsed into an arena:
// a request of many small messages (a graph far over --max_graph_nodes) is freed as a few blocks
// instead of one delete per message, which keeps refusing it cheap to the end of the call.
template <typename T>
struct ParsedRequest : ParsedLifts {
  ParsedRequest() = default;
  ~ParsedRequest() { TakeOverParsed(this); }
  google::protobuf::Arena arena;
  T& message = *google::protobuf::Arena::CreateMessage<T>(&arena);
  absl::Status status;  // INVALID_ARGUMENT when the bytes did not parse as T
};

// One message of a client stream, read again and again into the same storage. Not on an arena:
// an arena frees nothing before it dies, so it would hold every chunk until the stream ends,
// while Clear() lets the next chunk reuse this one's buffer.
template <typename T>
struct ParsedStreamMessage : ReceivedMessage {
  T message;
  absl::Status status;  // INVALID_ARGUMENT when the bytes did not parse as T
};

namespace request_parsing_internal {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

// Walks one message of type `d` up to the stream's current limit. Returns false with `why` set
// at the first string field that is not UTF-8 or the first wire fault; true when this part of
// the bytes is fine. Paths name fields as a reader of the proto would: "nodes[1].id",
// "inline_tensors[0].key" (repeated fields and map entries by their position on the wire).
inline bool Walk(const Descriptor& d, CodedInputStream& in, const std::string& prefix,
                 std::string* why) {
  std::map<int, int> seen;  // field number -> occurrences so far, for repeated fields
  for (;;) {
    const int offset = in.CurrentPosition();
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (in.ConsumedEntireMessage()) return true;
      *why = absl::StrCat("a zero tag at byte ", offset);
      return false;
    }
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const FieldDescriptor* f = d.FindFieldByNumber(number);
    std::string path = prefix + (f != nullptr ? f->name() : "");
    if (f != nullptr && f->is_repeated()) absl::StrAppend(&path, "[", seen[number]++, "]");
    const auto fault = [&](absl::string_view what) {
      const std::string field =
          f != nullptr ? absl::StrCat(path, " (number ", number, ")")
                       : absl::StrCat("number ", number, " (unknown to ", d.full_name(), ")");
      *why = absl::StrCat("field ", field, ": ", what, ", at byte ", offset);
      return false;
    };
    const bool length_delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (f != nullptr && length_delimited && f->type() == FieldDescriptor::TYPE_STRING) {
      uint32_t size = 0;
      std::string value;
      if (!in.ReadVarint32(&size) || !in.ReadString(&value, static_cast<int>(size))) {
        return fault("the wire data is cut short or malformed");
      }
      // The very check protobuf 3.21's parser makes on a proto3 string (VerifyUTF8).
      if (!google::protobuf::internal::IsStructurallyValidUTF8(value.data(),
                                                               static_cast<int>(value.size()))) {
        *why = absl::StrCat("field ", path, " is not valid UTF-8 (a proto3 string must be)");
        return false;
      }
    } else if (f != nullptr && length_delimited && f->type() == FieldDescriptor::TYPE_MESSAGE) {
      uint32_t size = 0;
      if (!in.ReadVarint32(&size)) return fault("the wire data is cut short or malformed");
      // Protobuf's own bound (100 levels): no schema of ours recurses, but a later one might.
      if (!in.IncrementRecursionDepth()) return fault("messages nest too deep");
      const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(size));
      if (!Walk(*f->message_type(), in, path + ".", why)) return false;
      // A length past the end of the bytes leaves some of the limit unread.
      if (in.BytesUntilLimit() != 0) return fault("the wire data is cut short or malformed");
      in.PopLimit(limit);
      in.DecrementRecursionDepth();
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return fault("the wire data is cut short or malformed");
    }
  }
}

}  // namespace request_parsing_internal

// Parses `buffer` as `message`. On failure, INVALID_ARGUMENT saying why: the bytes are walked a
// second time, which costs nothing on the path of requests that parse.
inline absl::Status ParseRequest(grpc::ByteBuffer* buffer, google::protobuf::Message* message) {
  const std::string& type = message->GetDescriptor()->full_name();
  if (!buffer->Valid()) return absl::InvalidArgumentError("the call carried no request message");
  {
    grpc::ProtoBufferReader reader(buffer);
    if (reader.status().ok() && message->ParseFromZeroCopyStream(&reader)) {
      return absl::OkStatus();
    }
  }
  std::string why = "protobuf refused it";
  {
    grpc::ProtoBufferReader reader(buffer);  // reads the buffer again from its start
    google::protobuf::io::CodedInputStream in(&reader);
    std::string found;
    if (!request_parsing_internal::Walk(*message->GetDescriptor(), in, "", &found)) {
      why = std::move(found);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request does not parse as ", type, ": ", why));
}

// A server-streaming reactor that ends its call at once with `status`: the answer of a
// streaming method to a request that does not parse.
template <typename Response>
class FinishedWriteReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit FinishedWriteReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

namespace request_parsing_internal {

// Never fails: the outcome of the parse travels with the request (see the top of this file).
template <typename Parsed>
class ParsedSerializationTraits {
 public:
  static grpc::Status Serialize(const Parsed& request, grpc::ByteBuffer* buffer, bool* own_buffer) {
    using T = std::remove_cvref_t<decltype(request.message)>;
    return grpc::SerializationTraits<T>::Serialize(request.message, buffer, own_buffer);
  }
  static grpc::Status Deserialize(grpc::ByteBuffer* buffer, Parsed* request) {
    request->wire_bytes = buffer->Length();
    bool parsed = false;
    if constexpr (requires { request->lift_pool; }) {
      if (request->lift_pool != nullptr) {
        parsed = ParseLifting(buffer, *request->lift_path, *request->lift_pool, &request->message,
                              &request->lifted);
        if (!parsed) request->lifted.clear();
      }
    }
    if (!parsed) request->status = opserve::ParseRequest(buffer, &request->message);
    request->proto = &request->message;
    buffer->Clear();  // as gRPC's own protobuf traits do: the bytes are not needed any more
    opserve::PublishParsed(request);
    return grpc::Status::OK;
  }
};

}  // namespace request_parsing_internal

}  // namespace opserve

namespace grpc {

template <typename T>
class SerializationTraits<opserve::ParsedRequest<T>, void>
    : public opserve::request_parsing_internal::ParsedSerializationTraits<
          opserve::ParsedRequest<T>> {};
template <typename T>
class SerializationTraits<opserve::ParsedStreamMessage<T>, void>
    : public opserve::request_parsing_internal::ParsedSerializationTraits<
          opserve::ParsedStreamMessage<T>> {};

}  // namespace grpc
