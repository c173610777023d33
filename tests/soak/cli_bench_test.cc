// `opserve-cli bench` end to end: the real binary against the real `opserve` on loopback, its
// --json report parsed and checked level by level, its stored inputs gone afterwards, and its
// refusals (a graph the server rejects, a target off loopback) with their exit statuses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/opserve_client.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/e2e/server_process.h"

namespace opserve::soak {
namespace {

namespace pb = google::protobuf;

std::string CliBinary() {
  const char* env = std::getenv("OPSERVE_CLI_BIN");
  return env != nullptr && *env != '\0' ? env : OPSERVE_CLI_DEFAULT;
}

struct CliRun {
  int exit_status = -1;
  std::string out;  // stdout; stderr goes to the test's log
};

// Runs opserve-cli with `args` (no shell metacharacters in them) and collects its stdout.
CliRun RunCli(const std::vector<std::string>& args) {
  CliRun run;
  const std::string command = absl::StrCat(CliBinary(), " ", absl::StrJoin(args, " "));
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) run.out.append(buf, n);
  const int status = pclose(pipe);
  run.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class CliBench : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = e2e::ServerProcess::Start(
        e2e::OpserveBinary(),
        {"--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1", "--device=cpu"});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    client::ClientOptions options;
    options.target = server_->target();
    options.timeout = absl::Seconds(10);
    auto c = client::Client::Connect(options);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }

  std::string Target() const { return absl::StrCat("--target=", server_->target()); }

  // The levels of a --json report, each checked for what any successful level must show.
  std::vector<pb::Struct> Levels(const CliRun& run) {
    pb::Struct report;
    EXPECT_TRUE(pb::util::JsonStringToMessage(run.out, &report).ok()) << run.out;
    std::vector<pb::Struct> levels;
    for (const pb::Value& v : report.fields().at("levels").list_value().values()) {
      const pb::Struct& level = v.struct_value();
      const auto& f = level.fields();
      const auto& latency = f.at("latency_us").struct_value().fields();
      EXPECT_EQ(f.at("errors").number_value(), 0) << run.out;
      EXPECT_GT(f.at("requests").number_value(), 0) << run.out;
      EXPECT_GT(f.at("throughput_rps").number_value(), 0) << run.out;
      EXPECT_GT(f.at("client_gbps").number_value(), 0) << run.out;
      EXPECT_GT(f.at("server_compute_us_mean").number_value(), 0) << run.out;
      EXPECT_LE(latency.at("p50").number_value(), latency.at("p90").number_value());
      EXPECT_LE(latency.at("p90").number_value(), latency.at("p99").number_value());
      EXPECT_LE(latency.at("p99").number_value(), latency.at("max").number_value());
      levels.push_back(level);
    }
    return levels;
  }

  std::unique_ptr<e2e::ServerProcess> server_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(CliBench, SweepsConcurrencyWithARequestCount) {
  const CliRun run = RunCli({Target(), "bench", "--op=row_mean", "--shape=64x33",
                             "--concurrency=1:4:3", "--requests=40", "--json"});
  ASSERT_EQ(run.exit_status, 0) << run.out;
  const std::vector<pb::Struct> levels = Levels(run);
  ASSERT_EQ(levels.size(), 2u) << run.out;
  EXPECT_EQ(levels[0].fields().at("concurrency").number_value(), 1);
  EXPECT_EQ(levels[1].fields().at("concurrency").number_value(), 4);
  for (const pb::Struct& level : levels) {
    EXPECT_EQ(level.fields().at("requests").number_value(), 40) << run.out;
  }
}

// --stream: the level's callers are streams, each with --inflight requests in flight; the level
// still sends exactly --requests.
TEST_F(CliBench, StreamsCarryTheRequestsOfALevel) {
  const CliRun run = RunCli({Target(), "bench", "--op=row_mean", "--shape=64x33", "--stream",
                             "--inflight=4", "--concurrency=3", "--requests=60", "--json"});
  ASSERT_EQ(run.exit_status, 0) << run.out;
  const std::vector<pb::Struct> levels = Levels(run);
  ASSERT_EQ(levels.size(), 1u) << run.out;
  EXPECT_EQ(levels[0].fields().at("concurrency").number_value(), 3);
  EXPECT_EQ(levels[0].fields().at("requests").number_value(), 60) << run.out;
  pb::Struct report;
  ASSERT_TRUE(pb::util::JsonStringToMessage(run.out, &report).ok());
  EXPECT_EQ(report.fields().at("stream_inflight").number_value(), 4) << run.out;
}

TEST_F(CliBench, StoredInputsForADurationAreDeletedAfterwards) {
  const CliRun run = RunCli({Target(), "bench", "--op=matmul", "--shape=16x8x4", "--inputs=stored",
                             "--concurrency=3", "--duration_s=0.5", "--json"});
  ASSERT_EQ(run.exit_status, 0) << run.out;
  ASSERT_EQ(Levels(run).size(), 1u);
  auto tensors = client_->ListTensors();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_TRUE(tensors->empty()) << tensors->front().name() << " was left behind";
}

TEST_F(CliBench, GraphFileAsATable) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("cli_bench_", getpid());
  std::filesystem::create_directories(dir);
  // sum of FLOAT32 [1, 2, 3, 4], the data as proto JSON writes bytes (base64).
  std::ofstream(dir / "graph.json")
      << R"({"nodes": [{"id": "s", "op": "sum", "inputs": [{"inlineName": "x"}]}],
             "inlineTensors": {"x": {"dtype": "FLOAT32", "shape": ["4"],
                                     "data": "AACAPwAAAEAAAEBAAACAQA=="}},
             "outputs": [{"node": "s", "returnInline": true}]})";
  for (const char* inputs : {"--inputs=inline", "--inputs=stored"}) {
    const CliRun run =
        RunCli({Target(), "bench", absl::StrCat("--graph=", (dir / "graph.json").string()), inputs,
                "--requests=20", "--concurrency=2"});
    EXPECT_EQ(run.exit_status, 0) << run.out;
    EXPECT_NE(run.out.find("p99_us"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("server_compute_us"), std::string::npos) << run.out;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(CliBench, RefusalsExitWithTheirStatus) {
  // The server rejects the graph: checked once before any level, exit 1.
  EXPECT_EQ(RunCli({Target(), "bench", "--op=matmul", "--dtype=int32", "--shape=4x4"}).exit_status,
            1);
  // Off loopback without --allow_remote, and bad flag values: usage errors, exit 2.
  EXPECT_EQ(RunCli({"--target=192.0.2.1:50051", "bench", "--op=sum", "--shape=4"}).exit_status, 2);
  EXPECT_EQ(RunCli({Target(), "bench", "--op=sum", "--shape=4", "--concurrency=4:2"}).exit_status,
            2);
  EXPECT_EQ(RunCli({Target(), "bench", "--op=sum", "--shape=4", "--concurrency=300"}).exit_status,
            2);
  EXPECT_EQ(RunCli({Target(), "bench", "--op=sum", "--inputs=maybe"}).exit_status, 2);
  EXPECT_EQ(RunCli({Target(), "bench", "--op=sum", "--stream", "--inflight=0"}).exit_status, 2);
  EXPECT_EQ(RunCli({Target(), "ls", "--op=sum"}).exit_status, 2);
}

}  // namespace
}  // namespace opserve::soak
