// Reading a running opserve from the outside, as an operator would: its resident set from
// /proc/PID/status, and gauges from its Prometheus /metrics page.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace opserve::soak {

// VmRSS of `pid`, in bytes.
absl::StatusOr<uint64_t> ResidentBytes(pid_t pid);

// The port in the server's "opserve: metrics on port N" line.
absl::StatusOr<int> MetricsPort(const std::string& server_output);

// The body of http://127.0.0.1:PORT/PATH (HTTP/1.0, so the body is never chunked).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path, absl::Duration timeout);

// The value of the sample of `family` whose labels include `label` (e.g. kind="used") in a
// Prometheus text exposition.
absl::StatusOr<double> SampleValue(const std::string& exposition, absl::string_view family,
                                   absl::string_view label);

}  // namespace opserve::soak
