// Text and JSON rendering for opserve-cli: tensors, tables, sizes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/host_tensor.h"
#include "opserve/v1/opserve.pb.h"

namespace opserve::cli {

// A plain-text table; right-aligned columns suit numbers.
class Table {
 public:
  struct Column {
    std::string header;
    bool right_align = false;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string Render() const;

  // For rows printed as they come (no AddRow): each column as wide as its header and at least
  // `min_width`; a longer cell widens its own line only.
  std::string HeaderLine(size_t min_width) const;
  std::string RowLine(const std::vector<std::string>& cells, size_t min_width) const;

 private:
  std::string Line(const std::vector<std::string>& cells, const std::vector<size_t>& widths) const;
  std::vector<size_t> HeaderWidths(size_t min_width) const;

  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// One element, as text: "%.6g" for floats, decimal for integers.
std::string FormatElement(const client::HostTensor& tensor, uint64_t index);

// "float32[32] = [0.1, ...]" in full up to `max_whole` elements (row by row for a matrix);
// above that, a summary: shape, size, the first and last `edge` values.
std::string DescribeTensor(const client::HostTensor& tensor, uint64_t max_whole = 64,
                           uint64_t edge = 4);

// {"dtype": "FLOAT32", "shape": [32], "values": [...]}; NaN and infinities are written the way
// proto JSON writes them: "NaN", "Infinity", "-Infinity".
std::string TensorJson(const client::HostTensor& tensor);

// "12.0 KiB", "1.00 GiB".
std::string FormatBytes(uint64_t bytes);

// "A: float32[64, 48], 12.0 KiB on cpu".
std::string InfoLine(const v1::TensorInfo& info);

// "rows [0, 5)": the rows of a sharded tensor that one shard holds.
std::string RowRange(const v1::TensorShard& shard);

// A sharded tensor's parts, a line each ("  shard 0: rows [0, 5) on cpu:0, 80 B"); nothing for
// a tensor that is not sharded.
std::string ShardLines(const v1::TensorInfo& info);

// The server's devices as a table: name, capability, memory used, budget and total, whether it
// serves (or why not), description.
std::string DevicesTable(const v1::ListOpsResponse& ops);

// Which devices run each "op/algorithm" row, when the devices differ in what they run (GPUs of
// several generations); empty when every device runs the same rows.
std::map<std::string, std::vector<std::string>> AlgorithmDevices(const v1::ListOpsResponse& ops);

// `opserve-cli ops`: the backend, the devices table, then a row per op and per algorithm (with
// a "devices" column naming who runs each row when the devices differ).
std::string OpsText(const v1::ListOpsResponse& ops);

// A JSON string literal with escapes.
std::string JsonQuote(absl::string_view text);

// How the CLI reports a failure on stderr: "opserve-cli: CODE: message" for a status the server
// sent, "opserve-cli: message" for a local one. gRPC's bare "Deadline Exceeded" gets a hint at
// --timeout.
std::string FailureText(const absl::Status& status, bool from_server);

}  // namespace opserve::cli
