// The infer endpoint's bodies: the protocol's JSON request, with Triton's binary tensor data
// extension (the JSON header's length in Inference-Header-Content-Length, then each input's
// bytes whose parameters give binary_data_size, in the order of inputs), becomes a
// ModelInferRequest; the ModelInferResponse becomes the JSON answer and the binary outputs that
// follow it. Every input reaches the request as raw_input_contents (JSON "data" encoded as
// little-endian elements), so that the service sees one path whichever way the bytes came.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inference/grpc_service.pb.h"

namespace opserve::http {

struct InferHttpRequest {
  inference::ModelInferRequest message;
  // Which outputs go back as binary data: each requested output's "binary_data", else the
  // request's "binary_data_output".
  bool binary_by_default = false;
  std::map<std::string, bool> binary;
};

// Reads the next `bytes` bytes of the body's binary part into `dst` (resized by the caller).
using ReadBinary = std::function<absl::Status(uint64_t bytes, std::string* dst)>;

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
