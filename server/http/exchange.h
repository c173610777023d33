// One HTTP request and its answer, over civetweb: the body read in bounded pieces, answers
// written with their length (so connections stay open for the next request), errors as the
// protocol's {"error": "..."} with the HTTP status of their gRPC code.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct mg_connection;

namespace opserve::http {

// The HTTP status of a gRPC code: 400 for a bad request, 404 for what does not exist, 401 and
// 403 for tokens, 429 and 503 for RESOURCE_EXHAUSTED and UNAVAILABLE, 501 for UNIMPLEMENTED.
int HttpStatusOf(grpc::StatusCode code);

class Exchange {
 public:
  Exchange(mg_connection* conn, uint64_t max_body_bytes, std::string replica_name);

  const std::string& method() const { return method_; }
  const std::string& path() const { return path_; }  // URL-decoded, without the query
  // A header's value, "" when absent.
  std::string Header(const char* name) const;
  // The body's length: Content-Length (a chunked body is read whole, up to the limit, first).
  // RESOURCE_EXHAUSTED past the limit, before any of it is read. A body with Content-Encoding
  // gzip or deflate (tritonclient's request_compression_algorithm) is read whole and decoded
  // first: its decoded length, the limit applying to both; INVALID_ARGUMENT naming the header
  // for another encoding or a body that does not decode.
  absl::StatusOr<uint64_t> BodyLength();
  // The next `bytes` bytes of the body into `dst`; INVALID_ARGUMENT when the body ends early.
  absl::Status Read(uint64_t bytes, std::string* dst);
  absl::Status Read(char* dst, uint64_t bytes);
  // The rest of the body (at most BodyLength()).
  absl::StatusOr<std::string> ReadAll();

  // A gRPC call's context for this request: its Authorization and x-opserve-session headers as
  // the call's metadata, so that tokens and a session's replica records are the gRPC calls'.
  std::unique_ptr<grpc::ClientContext> CallContext() const;

  void Reply(int status, std::string_view content_type, std::string_view body,
             const std::vector<std::string_view>& tail = {},
             const std::vector<std::pair<std::string, std::string>>& headers = {});
  void ReplyJson(std::string_view json) { Reply(200, "application/json", json); }
  void ReplyStatus(int status) { Reply(status, "", ""); }
  // `http_status` 0: HttpStatusOf the code.
  void ReplyError(const grpc::Status& s, int http_status = 0);
  void ReplyError(const absl::Status& s, int http_status = 0);
  bool replied() const { return replied_; }
  int status() const { return status_; }  // the answer's HTTP status

 private:
  absl::StatusOr<uint64_t> RawLength();  // BodyLength before any decoding
  absl::Status Decode();                  // the Content-Encoding undone, into chunked_

  mg_connection* const conn_;
  const uint64_t max_body_bytes_;
  const std::string replica_name_;
  std::string method_, path_;
  int64_t content_length_ = -1;  // -1: chunked or none
  std::string chunked_;          // a chunked body, read whole by BodyLength
  uint64_t chunked_pos_ = 0;
  bool chunked_read_ = false;
  bool replied_ = false;
  int status_ = 500;
  bool body_too_large_ = false;  // BodyLength refused it: its error answers 413
  bool decoded_ = false;         // Decode ran; decode_status_ is its answer
  absl::Status decode_status_;
};

}  // namespace opserve::http
