// `opserve --help` explains the server: a usage line, then every server flag with its
// description and default. The flags checked are the ones the README's "Server" section
// documents, read from README.md itself, so the README and the binary cannot drift apart
// silently in that direction.
//
// Exit status: Abseil (20220623, Debian 12) ends the process with 1 after printing any of its
// usage flags (--help, --helpfull, ...), as Google's tools always have; opserve keeps that.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/e2e/server_process.h"

#ifndef OPSERVE_SOURCE_DIR
#error "OPSERVE_SOURCE_DIR must name the source tree (tests/e2e/CMakeLists.txt sets it)"
#endif

namespace opserve::e2e {
namespace {

constexpr int kAbseilUsageExit = 1;

struct CommandOutput {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

CommandOutput RunOpserve(const std::string& args) {
  CommandOutput run;
  const std::string command = "'" + OpserveBinary() + "' " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

// The names of the flags (`--name`) the README's "## Server" section mentions.
std::set<std::string> ReadmeServerFlags() {
  std::ifstream in(std::string(OPSERVE_SOURCE_DIR) + "/README.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const size_t begin = readme.find("\n## Server\n");
  if (begin == std::string::npos) return {};
  const size_t end = readme.find("\n## ", begin + 1);
  const std::string section = readme.substr(begin, end == std::string::npos ? end : end - begin);
  std::set<std::string> flags;
  static const std::regex kFlag("--([a-z][a-z0-9_]*)");
  for (std::sregex_iterator it(section.begin(), section.end(), kFlag), last; it != last; ++it) {
    flags.insert((*it)[1]);
  }
  // Abseil's own usage flags, which the README names to point at the list, not as server flags.
  for (const char* usage : {"help", "helpfull"}) flags.erase(usage);
  return flags;
}

TEST(HelpTest, ListsEveryFlagTheReadmeDocumentsWithItsDefault) {
  const std::set<std::string> documented = ReadmeServerFlags();
  // The README's Server section documents at least the limits, TLS and token flags.
  ASSERT_GE(documented.size(), 10u)
      << "README.md's '## Server' section was not found or changed shape";

  const CommandOutput help = RunOpserve("--help");
  EXPECT_EQ(help.exit_code, kAbseilUsageExit) << help.output;
  EXPECT_EQ(help.output.find("No flags matched"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("Usage: opserve [--flag=value ...]"), std::string::npos)
      << help.output;
  EXPECT_EQ(help.output.find("SetProgramUsageMessage() never called"), std::string::npos)
      << help.output;

  for (const std::string& flag : documented) {
    SCOPED_TRACE("--" + flag);
    // Abseil's format: "    --name (description); default: value;", wrapped at 80 columns.
    const size_t at = help.output.find("\n    --" + flag + " (");
    ASSERT_NE(at, std::string::npos) << "--help does not list --" << flag << ":\n" << help.output;
    const size_t next = help.output.find("\n    --", at + 1);
    const std::string entry = help.output.substr(at, next == std::string::npos ? next : next - at);
    EXPECT_NE(entry.find("default: "), std::string::npos) << entry;
  }
}

// --helpfull keeps Abseil's whole list: the server's flags and the libraries' (e.g. --flagfile).
TEST(HelpTest, HelpfullListsEveryFlag) {
  const CommandOutput full = RunOpserve("--helpfull");
  EXPECT_EQ(full.exit_code, kAbseilUsageExit) << full.output;
  EXPECT_NE(full.output.find("--port ("), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("--flagfile ("), std::string::npos) << full.output;
}

// The --test_* flags exist in test builds only (OPSERVE_TEST_HOOKS, which this test is compiled
// with as the server is): a release server lists none and refuses them as unknown flags.
TEST(HelpTest, TestFlagsOnlyInTestBuilds) {
  const CommandOutput full = RunOpserve("--helpfull");
  ASSERT_NE(full.output.find("--port ("), std::string::npos) << full.output;
  const std::vector<std::string> hooks = {"test_fail_algorithm", "test_reply_without_device"};
#if OPSERVE_TEST_HOOKS
  for (const std::string& flag : hooks) {
    EXPECT_NE(full.output.find("\n    --" + flag + " ("), std::string::npos)
        << "a test build's --helpfull does not list --" << flag << ":\n" << full.output;
  }
#else
  EXPECT_EQ(full.output.find("--test_"), std::string::npos)
      << "a release build's --helpfull lists a test flag:\n" << full.output;
  for (const std::string& flag : hooks) {
    SCOPED_TRACE(flag);
    // --max_inflight=0 stops a server that took the test flag at start-up, so that it fails this
    // test instead of serving on; a release refuses the unknown flag before it looks at limits.
    const CommandOutput run =
        RunOpserve("--device=cpu --host=127.0.0.1 --port=0 --metrics_port=-1 --http_port=-1 --max_inflight=0 --" +
                   flag + "=sum/reference");
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("Unknown command line flag '" + flag + "'"), std::string::npos)
        << run.output;
    EXPECT_EQ(run.output.find("listening on"), std::string::npos) << run.output;
  }
#endif
}

// A value that would leave a server refusing every request (or one that cannot work) stops the
// server at start-up with status 2, naming the flag, instead of surfacing at the first request.
TEST(HelpTest, UnusableLimitsAreRefusedAtStartUp) {
  std::vector<const char*> flags = {
      "--max_inflight=0", "--max_graph_nodes=0", "--max_message_bytes=0",
      "--shutdown_grace_seconds=-1", "--lanes=-1", "--lanes=65", "--lanes=4 --max_inflight=2",
      "--graph_cache=-1", "--graph_cache=1025", "--completion_threads=0", "--completion_threads=9",
      "--lane_contexts=0", "--lane_contexts=9", "--max_batch_size=0", "--max_batch_size=65",
      "--worker_poll_us=-1", "--worker_poll_us=1000001",
      // Below the oldest GPUs the kernels are built for, or not MAJOR.MINOR.
      "--max_compute_capability=7.5", "--max_compute_capability=abc",
      "--max_compute_capability=8", "--max_compute_capability=9.0.1"};
#if OPSERVE_TEST_HOOKS
  flags.push_back("--test_reply_without_device=kernel");
#endif
  for (const char* flag : flags) {
    SCOPED_TRACE(flag);
    const CommandOutput run =
        RunOpserve(std::string("--device=cpu --host=127.0.0.1 --port=0 --metrics_port=-1 --http_port=-1 ") + flag);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
    EXPECT_NE(run.output.find(name), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("listening on"), std::string::npos) << run.output;
  }
}

// A valid cap starts the server on any backend: the same flags can go to every node of a fleet,
// CPU ones included (only the CUDA backend has a capability to cap).
TEST(HelpTest, ValidComputeCapabilityCapStartsTheServer) {
  for (const char* cap : {"8.0", "9.0", "12.0"}) {
    SCOPED_TRACE(cap);
    auto server = ServerProcess::Start(
        OpserveBinary(), {"--device=cpu", "--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1",
                          std::string("--max_compute_capability=") + cap});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_TRUE((*server)->Alive());
  }
}

}  // namespace
}  // namespace opserve::e2e
