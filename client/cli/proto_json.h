// Proto messages as JSON for `opserve-cli --json`, with 64-bit integers as JSON numbers.
//
// protobuf's own JSON mapping quotes int64 and uint64 ("bytes": "4096") so that JavaScript,
// whose numbers are doubles, cannot round them. The CLI's readers (jq, Python's json) keep
// integers exact, and a byte count that arrives as a string has to be converted by every script
// that sums it; so this printer writes them bare. Everything else follows the proto3 JSON
// mapping: lowerCamelCase names, enum names, base64 bytes, "NaN"/"Infinity" for non-finite
// doubles, every singular scalar field printed even at its default, unset oneof members left out.
#pragma once

#include <string>

#include "google/protobuf/message.h"

namespace opserve::cli {

std::string ProtoJson(const google::protobuf::Message& message);

}  // namespace opserve::cli
