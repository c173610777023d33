// What the fuzz targets share: an invariant check that crashes the run (libFuzzer records the
// input as a crash, the replay driver exits non-zero), and a filter for the status codes a
// validator may answer with.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/stubs/logging.h"

namespace opserve::fuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* cond, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz invariant violated: %s\n  %s\n", file, line, cond, what.c_str());
  std::abort();
}

// An error answer must carry one of `codes` and say something; anything else (UNKNOWN, INTERNAL,
// an empty message) means an unexpected path was taken.
inline bool ErrorIsOneOf(const absl::Status& s, std::span<const absl::StatusCode> codes) {
  if (s.ok() || s.message().empty()) return false;
  for (absl::StatusCode c : codes) {
    if (s.code() == c) return true;
  }
  return false;
}

// protobuf logs every malformed string field it meets (invalid UTF-8) to stderr: at thousands of
// inputs a second that buries libFuzzer's own output. FATAL messages still abort.
inline void SilenceProtobufLogs() { google::protobuf::SetLogHandler(nullptr); }

}  // namespace opserve::fuzz

#define FUZZ_CHECK(cond, what)                                                  \
  do {                                                                          \
    if (!(cond)) ::opserve::fuzz::Fail(__FILE__, __LINE__, #cond, (what));      \
  } while (0)
