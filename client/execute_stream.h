// One ExecuteStream kept busy with the same request: up to `inflight` copies in flight at once,
// a new one written as each answer arrives, until `more()` says stop. The load generators'
// streaming mode (opserve-cli bench --stream, opserve-bench --ops=stream) drives the server
// through it.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "client/opserve_client.h"

namespace opserve::client {

struct StreamAnswer {
  double latency_us = 0;  // from the request's write to its answer's read
  const v1::ExecuteStreamResponse& response;
};

// Writes on the calling thread and reads on one of its own. `more` is asked (under a lock, one
// caller at a time) before each request is written; `answered` is called on the reading thread
// for every answer. Returns once every request written is answered, with the stream's status.
absl::Status DriveExecuteStream(Client& client, const v1::ExecuteRequest& request, int inflight,
                                const std::function<bool()>& more,
                                const std::function<void(const StreamAnswer&)>& answered,
                                const CallOptions& call = {});

}  // namespace opserve::client
