// --trace_requests: the server writes each graph call's timeline when it stops. Every call has a
// line; one that completed passed every stage in order, one refused at planning stops there.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

constexpr int kCompleted = 20;
const char* const kStages[] = {"received", "planned", "launch_begin", "launch_end", "wait_begin",
                               "completed", "reply_begin", "finished", "done"};
constexpr int kNumStages = 9;

class TraceTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--trace_requests=", path_)};
  }
  const std::string path_ = absl::StrCat(::testing::TempDir(), "opserve_trace_", getpid(), ".csv");
};

TEST_F(TraceTest, EveryCallsStagesAreWrittenInOrderWhenTheServerStops) {
  std::remove(path_.c_str());
  ASSERT_TRUE(client().PutTensor("x", F32({10, 33}, std::vector<float>(330, 1.5f)), false).ok());
  v1::ExecuteRequest ok;
  AddNode(ok, "m", "row_mean", {Stored("x")});
  AddOutput(ok, "m", true);
  for (int i = 0; i < kCompleted; ++i) ASSERT_TRUE(client().Execute(ok).ok()) << i;
  v1::ExecuteRequest missing;
  AddNode(missing, "m", "row_mean", {Stored("no_such_tensor")});
  AddOutput(missing, "m", true);
  EXPECT_TRUE(StatusIs(client().Execute(missing).status(), absl::StatusCode::kNotFound, {"no_such_tensor"}));

  server().Signal(SIGTERM);
  absl::StatusOr<int> exit = server().WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << server().Output();
  EXPECT_NE(server().Output().find("request timelines written to " + path_), std::string::npos)
      << server().Output();

  std::ifstream in(path_);
  ASSERT_TRUE(in) << "no trace at " << path_;
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  std::vector<std::string> header = {"rpc"};
  for (const char* s : kStages) header.push_back(absl::StrCat(s, "_ns"));
  EXPECT_EQ(line, absl::StrJoin(header, ","));
  std::vector<std::vector<int64_t>> calls;
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    ASSERT_EQ(fields.size(), header.size()) << line;
    EXPECT_EQ(fields[0], "Execute") << line;
    std::vector<int64_t> ns;
    for (int s = 0; s < kNumStages; ++s) ns.push_back(std::stoll(fields[s + 1]));
    calls.push_back(ns);
  }
  ASSERT_EQ(calls.size(), static_cast<size_t>(kCompleted + 1)) << "a line per Execute call";
  for (int c = 0; c < kCompleted; ++c) {
    for (int s = 0; s < kNumStages; ++s) {
      EXPECT_GT(calls[c][s], 0) << "call " << c << " has no " << kStages[s];
      if (s > 0) EXPECT_LE(calls[c][s - 1], calls[c][s]) << "call " << c << " at " << kStages[s];
    }
    if (c > 0) EXPECT_LE(calls[c - 1][kNumStages - 2], calls[c][0]) << "calls out of order";
  }
  // Refused while planning: received, then finished and done, nothing between.
  const std::vector<int64_t>& refused = calls.back();
  EXPECT_GT(refused[0], 0);
  for (int s = 1; s <= 6; ++s) EXPECT_EQ(refused[s], 0) << kStages[s];
  EXPECT_GE(refused[7], refused[0]);
  EXPECT_GE(refused[8], refused[7]);
  std::remove(path_.c_str());
}

}  // namespace
}  // namespace opserve::e2e
