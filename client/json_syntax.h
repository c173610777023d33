// A JSON syntax check (RFC 8259) that says where the text goes wrong, as line:column.
//
// protobuf's JSON parser, which reads graph files, reports a syntax error as "Unexpected token."
// with no position; this check runs first so that a hand-edited graph's error points at its
// line. It only validates: the values are still parsed by protobuf.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace opserve::client {

// OK for one JSON value (surrounded by whitespace only); otherwise INVALID_ARGUMENT
// "SOURCE:LINE:COLUMN: what was expected, found what". Lines and columns count from 1, columns
// in bytes.
absl::Status CheckJsonSyntax(absl::string_view json, absl::string_view source);

}  // namespace opserve::client
