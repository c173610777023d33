// The infer endpoint's bodies: the protocol's JSON request, with Triton's binary tensor data
// extension (the JSON header's length in Inference-Header-Content-Length, then each input's
// bytes whose parameters give binary_data_size, in the order of inputs), becomes a
// ModelInferRequest; the ModelInferResponse becomes the JSON answer and the binary outputs that
// follow it. Every input reaches the request as raw_input_contents (JSON "data" encoded as
// little-endian elements), so that the service sees one path whichever way the bytes came. The
// bytes stay out of the message: lent_call.h sends them from where they were read.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inference/grpc_service.pb.h"

namespace opserve::http {

// One raw_input_contents entry: its bytes in pieces.
struct RawInput {
  std::vector<std::string_view> pieces;
  uint64_t bytes = 0;
};

struct InferHttpRequest {
  // Without raw_input_contents: `raw` holds them, in order.
  inference::ModelInferRequest message;
  std::vector<RawInput> raw;
  // What `raw` views: blocks of the body (under glibc's mmap threshold, so that their memory is
  // reused from request to request instead of faulted in anew) and encoded JSON data.
  std::deque<std::unique_ptr<char[]>> blocks;
  std::deque<std::string> encoded;
  // Which outputs go back as binary data: each requested output's "binary_data", else the
  // request's "binary_data_output".
  bool binary_by_default = false;
  std::map<std::string, bool> binary;
};

// Reads the next `bytes` bytes of the body's binary part into `dst`.
using ReadBinary = std::function<absl::Status(char* dst, uint64_t bytes)>;

// `header` is the JSON part; `binary_bytes` how many bytes follow it, which `read` hands out.
// INVALID_ARGUMENT naming the input or field at fault.
absl::Status InferRequestFromHttp(std::string_view header, uint64_t binary_bytes,
                                  const ReadBinary& read, InferHttpRequest* out);

// The JSON part of the answer, and the outputs' bytes that follow it (views into `response`),
// in order. No binary part: `binary` stays empty.
absl::Status InferResponseToHttp(const inference::ModelInferResponse& response,
                                 const InferHttpRequest& request, std::string* json,
                                 std::vector<std::string_view>* binary);

}  // namespace opserve::http
