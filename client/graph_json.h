// Graph files: the proto JSON form of an ExecuteRequest, with one extension for convenience:
// an "inlineTensors" value may be {"npy": "path.npy"}, a path relative to the graph file's
// directory, which is loaded and stands in for the Tensor. For example:
//
//   {"nodes": [{"id": "mm", "op": "matmul", "inputs": [{"stored": "A"}, {"inlineName": "B"}]}],
//    "inlineTensors": {"B": {"npy": "b.npy"}},
//    "outputs": [{"node": "mm", "returnInline": true}]}
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "opserve/v1/opserve.pb.h"

namespace opserve::client {

// Reads and parses the graph file at `path`.
absl::StatusOr<v1::ExecuteRequest> LoadGraphFile(const std::string& path);

// Parses graph JSON. `base_dir` resolves relative .npy paths; `source` names the graph in errors,
// which also give the JSON path of the offending value, e.g. "$.inlineTensors.B.npy".
absl::StatusOr<v1::ExecuteRequest> ParseGraphJson(absl::string_view json,
                                                  const std::string& base_dir,
                                                  absl::string_view source);

}  // namespace opserve::client
