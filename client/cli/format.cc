#include "client/cli/format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace opserve::cli {
namespace {

template <typename T>
T Load(const std::string& data, uint64_t index) {
  T value;
  std::memcpy(&value, data.data() + index * sizeof(T), sizeof(T));
  return value;
}

// bfloat16 is the upper half of a float32.
float LoadBfloat16(const std::string& data, uint64_t index) {
  const uint32_t bits = uint32_t{Load<uint16_t>(data, index)} << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

bool IsFloat(v1::DType dtype) { return dtype == v1::FLOAT32 || dtype == v1::BFLOAT16; }

double FloatAt(const client::HostTensor& tensor, uint64_t index) {
  return tensor.dtype == v1::FLOAT32 ? Load<float>(tensor.data, index)
                                     : LoadBfloat16(tensor.data, index);
}

uint64_t Count(const client::HostTensor& tensor) {
  const uint64_t size = client::DTypeSize(tensor.dtype);
  return size == 0 ? 0 : tensor.data.size() / size;
}

std::string Elements(const client::HostTensor& tensor, uint64_t begin, uint64_t end) {
  std::vector<std::string> values;
  for (uint64_t i = begin; i < end; ++i) values.push_back(FormatElement(tensor, i));
  return absl::StrJoin(values, ", ");
}

}  // namespace

std::vector<size_t> Table::HeaderWidths(size_t min_width) const {
  std::vector<size_t> widths;
  for (const Column& column : columns_) widths.push_back(std::max(min_width, column.header.size()));
  return widths;
}

std::string Table::Line(const std::vector<std::string>& cells,
                        const std::vector<size_t>& widths) const {
  std::string line;
  for (size_t i = 0; i < columns_.size(); ++i) {
    const std::string& cell = i < cells.size() ? cells[i] : "";
    const std::string pad(widths[i] - std::min(widths[i], cell.size()), ' ');
    absl::StrAppend(&line, i ? "  " : "", columns_[i].right_align ? pad + cell : cell + pad);
  }
  line.erase(line.find_last_not_of(' ') + 1);
  return line + "\n";
}

std::string Table::Render() const {
  std::vector<size_t> widths = HeaderWidths(0);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::vector<std::string> headers;
  for (const Column& column : columns_) headers.push_back(column.header);
  std::string out = Line(headers, widths);
  for (const auto& row : rows_) out += Line(row, widths);
  return out;
}

std::string Table::HeaderLine(size_t min_width) const {
  std::vector<std::string> headers;
  for (const Column& column : columns_) headers.push_back(column.header);
  return Line(headers, HeaderWidths(min_width));
}

std::string Table::RowLine(const std::vector<std::string>& cells, size_t min_width) const {
  return Line(cells, HeaderWidths(min_width));
}

std::string FormatElement(const client::HostTensor& tensor, uint64_t index) {
  switch (tensor.dtype) {
    case v1::FLOAT32:
    case v1::BFLOAT16:
      return absl::StrFormat("%.6g", FloatAt(tensor, index));
    case v1::INT32:
      return absl::StrCat(Load<int32_t>(tensor.data, index));
    case v1::INT64:
      return absl::StrCat(Load<int64_t>(tensor.data, index));
    default:
      return "?";
  }
}

std::string DescribeTensor(const client::HostTensor& tensor, uint64_t max_whole, uint64_t edge) {
  const uint64_t count = Count(tensor);
  std::string out =
      absl::StrCat(client::DTypeName(tensor.dtype), client::ShapeString(tensor.shape));
  if (count <= max_whole) {
    if (tensor.shape.size() == 2 && tensor.shape[0] > 1 && count > 0) {
      const uint64_t cols = static_cast<uint64_t>(tensor.shape[1]);
      absl::StrAppend(&out, " =\n");
      for (uint64_t row = 0; row < count / cols; ++row) {
        absl::StrAppend(&out, "  [", Elements(tensor, row * cols, (row + 1) * cols), "]\n");
      }
      out.pop_back();
      return out;
    }
    return absl::StrCat(out, " = [", Elements(tensor, 0, count), "]");
  }
  edge = std::min(edge, count);
  return absl::StrCat(out, " (", FormatBytes(tensor.data.size()), "): first [",
                      Elements(tensor, 0, edge), "] ... last [",
                      Elements(tensor, count - edge, count), "]");
}

std::string TensorJson(const client::HostTensor& tensor) {
  std::string out = absl::StrCat("{\"dtype\": \"", v1::DType_Name(tensor.dtype), "\", \"shape\": [",
                                 absl::StrJoin(tensor.shape, ", "), "], \"values\": [");
  const uint64_t count = Count(tensor);
  for (uint64_t i = 0; i < count; ++i) {
    if (i) out += ", ";
    if (!IsFloat(tensor.dtype)) {
      out += FormatElement(tensor, i);
      continue;
    }
    const double value = FloatAt(tensor, i);
    if (std::isnan(value)) {
      out += "\"NaN\"";
    } else if (std::isinf(value)) {
      out += value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
    } else {
      out += absl::StrFormat("%.9g", value);  // enough digits to round-trip a float32
    }
  }
  return out + "]}";
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  // Two literal formats: absl::StrFormat checks its format at compile time (clang insists).
  return value < 10 ? absl::StrFormat("%.2f %s", value, units[unit])
                    : absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string InfoLine(const v1::TensorInfo& info) {
  return absl::StrCat(
      info.name(), ": ", client::DTypeName(info.dtype()),
      client::ShapeString(std::vector<int64_t>(info.shape().begin(), info.shape().end())), ", ",
      FormatBytes(info.bytes()), " on ", info.device());
}

std::string RowRange(const v1::TensorShard& shard) {
  return absl::StrCat("rows [", shard.row_begin(), ", ", shard.row_begin() + shard.rows(), ")");
}

std::string ShardLines(const v1::TensorInfo& info) {
  std::string out;
  for (int i = 0; i < info.shards_size(); ++i) {
    const v1::TensorShard& shard = info.shards(i);
    absl::StrAppend(&out, "  shard ", i, ": ", RowRange(shard), " on ", shard.device(), ", ",
                    FormatBytes(shard.bytes()), "\n");
  }
  return out;
}

std::string DevicesTable(const v1::ListOpsResponse& ops) {
  Table table({{"device"},
               {"capability"},
               {"used", true},
               {"budget", true},
               {"total", true},
               {"state"},
               {"description"}});
  for (const v1::DeviceInfo& device : ops.devices()) {
    table.AddRow({device.name(), device.capability(), FormatBytes(device.memory_used()),
                  FormatBytes(device.memory_budget()), FormatBytes(device.memory_total()),
                  device.serving() ? "serving" : absl::StrCat("out: ", device.error()),
                  device.description()});
  }
  return table.Render();
}

std::map<std::string, std::vector<std::string>> AlgorithmDevices(const v1::ListOpsResponse& ops) {
  std::map<std::string, std::vector<std::string>> runs_on;
  std::set<std::set<std::string>> distinct;
  for (const v1::DeviceInfo& device : ops.devices()) {
    distinct.emplace(device.algorithms().begin(), device.algorithms().end());
    for (const std::string& row : device.algorithms()) runs_on[row].push_back(device.name());
  }
  if (distinct.size() <= 1) runs_on.clear();
  return runs_on;
}

std::string OpsText(const v1::ListOpsResponse& ops) {
  std::string out;
  if (ops.devices().empty()) {  // a server from before devices were listed
    out = absl::StrCat("backend ", ops.backend(), ", device ", ops.device(), "\n\n");
  } else {
    out = absl::StrCat("backend ", ops.backend(), ", ", ops.devices_size(),
                       ops.devices_size() == 1 ? " device" : " devices", "\n\n",
                       DevicesTable(ops), "\n");
  }
  // Devices of one kind run the same rows; where they differ (GPUs of several generations),
  // each algorithm row names the devices that run it.
  const std::map<std::string, std::vector<std::string>> runs_on = AlgorithmDevices(ops);
  constexpr size_t kDevicesColumn = 4;  // before the description
  std::vector<Table::Column> columns = {
      {"op"}, {"algorithm"}, {"dtypes"}, {"deterministic"}, {"description"}};
  if (!runs_on.empty()) columns.insert(columns.begin() + kDevicesColumn, {"devices"});
  Table table(std::move(columns));
  auto dtype_list = [](const auto& dtypes) {
    std::vector<std::string> names;
    for (int dtype : dtypes) names.emplace_back(client::DTypeName(static_cast<v1::DType>(dtype)));
    return absl::StrJoin(names, ",");
  };
  for (const v1::OpInfo& op : ops.ops()) {
    std::vector<std::string> row = {op.name(),
                                    absl::StrCat("(default: ", op.default_algorithm(), ")"),
                                    dtype_list(op.dtypes()), "", op.description()};
    if (!runs_on.empty()) row.insert(row.begin() + kDevicesColumn, "");
    table.AddRow(std::move(row));
    for (const v1::AlgorithmInfo& algorithm : op.algorithms()) {
      row = {"", absl::StrCat(algorithm.name(), algorithm.is_default() ? " *" : ""),
             dtype_list(algorithm.dtypes()), algorithm.deterministic() ? "yes" : "no",
             algorithm.description()};
      if (!runs_on.empty()) {
        const auto devices = runs_on.find(absl::StrCat(op.name(), "/", algorithm.name()));
        row.insert(row.begin() + kDevicesColumn,
                   devices == runs_on.end() ? "none" : absl::StrJoin(devices->second, ","));
      }
      table.AddRow(std::move(row));
    }
  }
  return out + table.Render();
}

std::string FailureText(const absl::Status& status, bool from_server) {
  if (from_server) {
    // gRPC's own text for a deadline says nothing of which deadline, or how to change it.
    const bool bare_deadline =
        absl::IsDeadlineExceeded(status) && status.message() == "Deadline Exceeded";
    return absl::StrCat("opserve-cli: ", absl::StatusCodeToString(status.code()), ": ",
                        status.message(),
                        bare_deadline ? " (no answer in time; --timeout=SECONDS sets the deadline)"
                                      : "");
  }
  return absl::StrCat("opserve-cli: ", status.message());
}

}  // namespace opserve::cli
