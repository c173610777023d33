#include "client/cli/run.h"

#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/format.h"
#include "client/cli/proto_json.h"
#include "client/graph_json.h"

namespace opserve::cli {
namespace {

using client::HostTensor;

int Fail(const absl::Status& status, bool from_server) {
  std::cerr << FailureText(status, from_server) << "\n";
  return 1;
}

void PrintRunText(const v1::ExecuteResponse& response,
                  const std::vector<std::pair<std::string, HostTensor>>& outputs) {
  for (const auto& [node, tensor] : outputs) {
    std::cout << "output " << node << ": " << DescribeTensor(tensor) << "\n";
  }
  for (const v1::TensorInfo& info : response.stored()) {
    std::cout << "stored " << InfoLine(info) << "\n";
  }
  if (!outputs.empty() || response.stored_size() > 0) std::cout << "\n";
  // A node the planner fused into another ran no kernel of its own: it reports the fused
  // kernel's figures, shared with the node named in the "fused into" column (shown only when
  // some node was fused).
  const bool fused = std::any_of(response.nodes().begin(), response.nodes().end(),
                                 [](const v1::NodeResult& n) { return !n.fused_into().empty(); });
  std::vector<Table::Column> columns = {{"node"},          {"op"},           {"algorithm"},
                                        {"shape"},         {"kernel_us", true}, {"bytes", true},
                                        {"GB/s", true},    {"GFLOP/s", true}};
  if (fused) columns.push_back({"fused into"});
  Table table(std::move(columns));
  for (const v1::NodeResult& node : response.nodes()) {
    std::vector<std::string> row = {
        node.id(), node.op(), node.algorithm(),
        absl::StrCat(client::DTypeName(node.dtype()),
                     client::ShapeString(
                         std::vector<int64_t>(node.shape().begin(), node.shape().end()))),
        absl::StrFormat("%.1f", node.kernel_us()), absl::StrCat(node.bytes()),
        absl::StrFormat("%.2f", node.gbps()), absl::StrFormat("%.2f", node.gflops())};
    if (fused) row.push_back(node.fused_into());
    table.AddRow(std::move(row));
  }
  std::cout << table.Render();
  const v1::RequestTiming& t = response.timing();
  std::cout << absl::StrFormat(
      "\ndevice %s: queue %.1f us, input %.1f us, compute %.1f us, output %.1f us, total %.1f us\n",
      response.device(), t.queue_us(), t.input_us(), t.compute_us(), t.output_us(), t.total_us());
  // Stored inputs that lived on other devices than the one the graph ran on, and outputs kept
  // on another device than it.
  if (response.peer_copy_bytes() != 0 || t.peer_copy_us() != 0) {
    std::cout << absl::StrFormat("peer copies: %s in %.1f us\n",
                                 FormatBytes(response.peer_copy_bytes()), t.peer_copy_us());
  }
  // Whether the nodes ran as one CUDA graph (the server's --graph_cache); nothing when they did not.
  switch (response.graph()) {
    case v1::GRAPH_CAPTURED: std::cout << "CUDA graph: captured from this request\n"; break;
    case v1::GRAPH_REPLAYED: std::cout << "CUDA graph: replayed\n"; break;
    case v1::GRAPH_REBOUND: std::cout << "CUDA graph: replayed, rebound to new tensors\n"; break;
    default: break;
  }
}

}  // namespace

int RunGraph(client::Client& c, const std::string& path, bool json,
             std::optional<absl::Duration> timeout) {
  absl::StatusOr<v1::ExecuteRequest> request = client::LoadGraphFile(path);
  if (!request.ok()) return Fail(request.status(), false);
  // Legal, and a way to time a graph, but more often an "outputs" list forgotten or misspelt.
  const bool keeps_something =
      std::any_of(request->outputs().begin(), request->outputs().end(),
                  [](const v1::OutputSpec& o) { return o.return_inline() || !o.store_as().empty(); });
  if (!keeps_something) {
    std::cerr << "opserve-cli: warning: " << path
              << ": the graph returns and stores nothing (no $.outputs entry with "
                 "\"returnInline\": true or a \"storeAs\" name); only its timings will show\n";
  }
  client::CallOptions call;
  call.timeout = timeout.value_or(absl::InfiniteDuration());
  absl::StatusOr<v1::ExecuteResponse> response = c.Execute(*request, call);
  if (!response.ok()) return Fail(response.status(), true);

  std::vector<std::pair<std::string, HostTensor>> outputs;
  for (v1::NamedTensor& named : *response->mutable_outputs()) {
    absl::StatusOr<HostTensor> tensor = client::FromProto(named.tensor());
    if (!tensor.ok()) {
      return Fail(absl::DataLossError(
                      absl::StrCat("output ", named.node(), ": ", tensor.status().message())),
                  false);
    }
    outputs.emplace_back(named.node(), *std::move(tensor));
  }
  // The outputs are shown decoded, below the response, rather than as base64 inside it.
  response->clear_outputs();
  if (!json) {
    PrintRunText(*response, outputs);
    return 0;
  }
  std::cout << "{\"response\": " << ProtoJson(*response) << ", \"outputs\": {";
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::cout << (i ? ", " : "") << JsonQuote(outputs[i].first) << ": "
              << TensorJson(outputs[i].second);
  }
  std::cout << "}}\n";
  return 0;
}

}  // namespace opserve::cli
