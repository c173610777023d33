#include "server/http/exchange.h"

#include <civetweb.h>
#include <zlib.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/http/json_proto.h"

namespace opserve::http {
namespace {

// Pieces of a chunked body read, or of a compressed body decoded, at a time: the limit is
// checked between them.
constexpr uint64_t kReadPiece = 1 << 20;

// `in` decoded: gzip, or deflate as HTTP means it (the zlib format, what tritonclient's
// zlib.compress sends). RESOURCE_EXHAUSTED (and *too_large) once the decoded bytes pass `limit`,
// so that a small body cannot unfold into more memory than a plain one may take.
absl::StatusOr<std::string> Inflate(const std::string& in, absl::string_view encoding,
                                    uint64_t limit, bool* too_large) {
  struct Stream {
    z_stream z{};
    ~Stream() { inflateEnd(&z); }
  } stream;
  z_stream& z = stream.z;
  if (inflateInit2(&z, encoding == "gzip" ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK) {
    return absl::InternalError("zlib cannot start decoding");
  }
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not ", encoding, " data (Content-Encoding: ",
                     encoding, "): ", why));
  };
  std::string out;
  uint64_t fed = 0;
  for (;;) {
    if (z.avail_in == 0 && fed < in.size()) {  // uInt counts: the input in pieces as well
      const uint64_t n = std::min<uint64_t>(in.size() - fed, kReadPiece);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + fed));
      z.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    const size_t at = out.size();
    out.resize(at + kReadPiece);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + at);
    z.avail_out = static_cast<uInt>(kReadPiece);
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.resize(at + kReadPiece - z.avail_out);
    if (out.size() > limit) {
      *too_large = true;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the request body, decoded (Content-Encoding: ", encoding,
          "), is larger than the server's limit of ", limit, " bytes (--max_message_bytes)"));
    }
    if (rc == Z_STREAM_END) {
      if (z.avail_in != 0 || fed < in.size()) return bad("bytes follow the end of its data");
      return out;
    }
    if (rc == Z_BUF_ERROR && z.avail_in == 0 && fed == in.size()) return bad("it ends early");
    if (rc != Z_OK && rc != Z_BUF_ERROR) return bad(z.msg != nullptr ? z.msg : "zlib error");
  }
}

}  // namespace

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

Exchange::Exchange(mg_connection* conn, uint64_t max_body_bytes, std::string replica_name)
    : conn_(conn), max_body_bytes_(max_body_bytes), replica_name_(std::move(replica_name)) {
  const mg_request_info* info = mg_get_request_info(conn);
  method_ = info->request_method != nullptr ? info->request_method : "";
  path_ = info->local_uri != nullptr ? info->local_uri : "";
  content_length_ = info->content_length;
}

std::string Exchange::Header(const char* name) const {
  const char* v = mg_get_header(conn_, name);
  return v != nullptr ? v : "";
}

absl::StatusOr<uint64_t> Exchange::BodyLength() {
  if (!decoded_) {
    decoded_ = true;
    decode_status_ = Decode();
  }
  if (!decode_status_.ok()) return decode_status_;
  return RawLength();
}

absl::Status Exchange::Decode() {
  const std::string encoding = absl::AsciiStrToLower(Header("Content-Encoding"));
  if (encoding.empty() || encoding == "identity") return absl::OkStatus();
  if (encoding != "gzip" && encoding != "deflate") {
    return absl::InvalidArgumentError(absl::StrCat(
        "Content-Encoding '", encoding, "' is not one this server decodes (gzip, deflate)"));
  }
  absl::StatusOr<uint64_t> length = RawLength();
  if (!length.ok()) return length.status();
  std::string raw;
  if (absl::Status s = Read(*length, &raw); !s.ok()) return s;
  absl::StatusOr<std::string> body = Inflate(raw, encoding, max_body_bytes_, &body_too_large_);
  if (!body.ok()) return body.status();
  // From here Read serves the decoded body as it serves a chunked one.
  chunked_ = std::move(*body);
  chunked_pos_ = 0;
  chunked_read_ = true;
  content_length_ = -1;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Exchange::RawLength() {
  auto too_large = [&](absl::string_view body) {
    body_too_large_ = true;
    return absl::ResourceExhaustedError(
        absl::StrCat(body, " is larger than the server's limit of ", max_body_bytes_,
                     " bytes (--max_message_bytes)"));
  };
  if (content_length_ >= 0) {
    if (static_cast<uint64_t>(content_length_) > max_body_bytes_) {
      return too_large(absl::StrCat("the request body (", content_length_, " bytes)"));
    }
    return static_cast<uint64_t>(content_length_);
  }
  if (!chunked_read_) {  // no Content-Length: read what comes, up to the limit
    chunked_read_ = true;
    for (;;) {
      const size_t at = chunked_.size();
      chunked_.resize(at + kReadPiece);
      const int n = mg_read(conn_, chunked_.data() + at, kReadPiece);
      chunked_.resize(at + std::max(n, 0));
      if (n <= 0) break;
      if (chunked_.size() > max_body_bytes_) return too_large("the chunked request body");
    }
  }
  return chunked_.size();
}

absl::Status Exchange::Read(uint64_t bytes, std::string* dst) {
  dst->resize(bytes);
  return Read(dst->data(), bytes);
}

absl::Status Exchange::Read(char* dst, uint64_t bytes) {
  if (content_length_ < 0) {
    if (chunked_.size() - chunked_pos_ < bytes) {
      return absl::InvalidArgumentError("the request body ended early");
    }
    std::copy_n(chunked_.data() + chunked_pos_, bytes, dst);
    chunked_pos_ += bytes;
    return absl::OkStatus();
  }
  uint64_t got = 0;
  while (got < bytes) {
    const int n = mg_read(conn_, dst + got, std::min<uint64_t>(bytes - got, 1u << 30));
    if (n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request body ended after ", got, " of ", bytes, " bytes"));
    }
    got += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Exchange::ReadAll() {
  absl::StatusOr<uint64_t> length = BodyLength();
  if (!length.ok()) return length.status();
  std::string body;
  if (absl::Status s = Read(*length, &body); !s.ok()) return s;
  return body;
}

std::unique_ptr<grpc::ClientContext> Exchange::CallContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (std::string auth = Header("Authorization"); !auth.empty()) {
    ctx->AddMetadata("authorization", auth);
  }
  if (std::string session = Header("x-opserve-session"); !session.empty()) {
    ctx->AddMetadata("x-opserve-session", session);
  }
  return ctx;
}

void Exchange::Reply(int status, std::string_view content_type, std::string_view body,
                     const std::vector<std::string_view>& tail,
                     const std::vector<std::pair<std::string, std::string>>& headers) {
  replied_ = true;
  status_ = status;
  uint64_t length = body.size();
  for (std::string_view t : tail) length += t.size();
  mg_response_header_start(conn_, status);
  if (!content_type.empty()) {
    mg_response_header_add(conn_, "Content-Type", content_type.data(),
                           static_cast<int>(content_type.size()));
  }
  const std::string length_text = absl::StrCat(length);
  mg_response_header_add(conn_, "Content-Length", length_text.c_str(), -1);
  if (!replica_name_.empty()) {
    mg_response_header_add(conn_, "x-opserve-replica", replica_name_.c_str(), -1);
  }
  for (const auto& [name, value] : headers) {
    mg_response_header_add(conn_, name.c_str(), value.c_str(), -1);
  }
  mg_response_header_send(conn_);
  if (!body.empty()) mg_write(conn_, body.data(), body.size());
  for (std::string_view t : tail) {
    // mg_write takes a size_t but answers in an int: pieces under 1 GiB.
    for (size_t at = 0; at < t.size(); at += 1u << 30) {
      if (mg_write(conn_, t.data() + at, std::min<size_t>(t.size() - at, 1u << 30)) <= 0) return;
    }
  }
}

void Exchange::ReplyError(const grpc::Status& s, int http_status) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  w.StartObject();
  w.Key("error");
  w.String(s.error_message().data(), static_cast<rapidjson::SizeType>(s.error_message().size()));
  w.EndObject();
  std::vector<std::pair<std::string, std::string>> headers;
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    headers.emplace_back("WWW-Authenticate", "Bearer");
  }
  // A body past the limit is the protocol's 413, not a refusal of the call's.
  int status = http_status != 0 ? http_status : HttpStatusOf(s.error_code());
  if (body_too_large_ && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) status = 413;
  Reply(status, "application/json", std::string_view(buffer.GetString(), buffer.GetSize()), {},
        headers);
}

void Exchange::ReplyError(const absl::Status& s, int http_status) {
  ReplyError(grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message())),
             http_status);
}

}  // namespace opserve::http
