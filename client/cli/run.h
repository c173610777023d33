// `opserve-cli run GRAPH.json`: executes a graph file and shows what came back: the outputs
// decoded, the tensors stored, and per node the algorithm that ran, its kernel time, bytes and
// rates, then the request's timing; or all of it as one JSON object.
#pragma once

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "client/opserve_client.h"

namespace opserve::cli {

// Returns the exit status: 0, or 1 after saying why on stderr. `timeout` unset: no deadline,
// since a big graph legitimately runs long.
int RunGraph(client::Client& c, const std::string& path, bool json,
             std::optional<absl::Duration> timeout);

}  // namespace opserve::cli
