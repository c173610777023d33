// Ordering and isolation under concurrent load, at --lanes=1 and --lanes=4, on whatever backend
// $OPSERVE_TEST_DEVICE names (the CPU in `make test`, the GPU in scripts/gpu-suite.sh). Several
// clients, each on its own connection, overlap reads, overwrites and deletes of the same names,
// and every answer is checked:
//  - a read racing an overwrite sees one version whole, never a mix: every tensor written here
//    holds one value in every element, so a row sum or a download that mixes versions shows;
//  - a request sees what requests that completed before it stored (read-your-writes);
//  - concurrent requests never see each other's intermediates: every client's graph uses the
//    same node ids on its own random inputs, checked against the result computed here.
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

constexpr int kClients = 8;
constexpr int kSharedNames = 3;
constexpr int64_t kCols = 33;
// A version's row count follows from its value, so a read whose bytes came from another
// version (say, memory a deleted tensor gave back and another version took) shows in the shape.
int64_t RowsOf(float version) { return 16 + static_cast<int64_t>(version) % 48; }
constexpr auto kDuration = std::chrono::seconds(3);
constexpr int kMaxIterations = 2000;  // per client, whatever the clock says
// Each client goes on past kDuration until it has checked this many answers, so that a slow
// machine (a sanitizer build on a loaded CI host) still tests something; kDeadline bounds it.
constexpr int64_t kMinCheckedPerClient = 12;
constexpr auto kDeadline = std::chrono::seconds(60);

class LanesTest : public OpserveTest, public ::testing::WithParamInterface<int> {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--lanes=", GetParam())};
  }
};

// FLOAT32 [RowsOf(v), kCols] with every element `v`: exact in every sum below.
client::HostTensor Filled(float v) {
  return F32({RowsOf(v), kCols}, std::vector<float>(RowsOf(v) * kCols, v));
}

// What one client saw go wrong; empty when nothing did.
struct Tally {
  int64_t checked = 0;
  std::vector<std::string> problems;
  void Problem(std::string p) {
    if (problems.size() < 5) problems.push_back(std::move(p));
  }
  // True when `s` failed. NOT_FOUND is an answer a racing delete may give; any other failure
  // is a problem.
  bool Failed(const absl::Status& s, absl::string_view what) {
    if (s.ok()) return false;
    if (s.code() != absl::StatusCode::kNotFound) Problem(absl::StrCat(what, ": ", s.ToString()));
    return true;
  }
};

// `values` are all one positive integer version: returns it, or -1.
double OneVersion(const std::vector<float>& values) {
  if (values.empty() || values[0] <= 0 || values[0] != std::floor(values[0])) return -1;
  for (float v : values) {
    if (v != values[0]) return -1;
  }
  return values[0];
}

void RunClient(const std::string& target, int id, Tally& tally) {
  client::ClientOptions options;
  options.target = target;
  // A connect attempt can fail transiently on a loaded CI machine (seen under TSAN); without
  // wait_for_ready every call during the reconnect backoff fails at once with UNAVAILABLE, which
  // says nothing about lanes. The deadline still bounds a server that never answers.
  options.wait_for_ready = true;
  options.timeout = absl::Seconds(60);
  auto connected = client::Client::Connect(options);
  if (!connected.ok()) {
    tally.Problem(absl::StrCat("connect: ", connected.status().ToString()));
    return;
  }
  client::Client& c = **connected;
  std::mt19937_64 rng(std::random_device{}() + id);
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + kDuration;
  const auto deadline = start + kDeadline;
  const auto more = [&] {
    const auto now = std::chrono::steady_clock::now();
    return now < deadline && (now < until || tally.checked < kMinCheckedPerClient);
  };
  const std::string mine = absl::StrCat("private_", id);
  for (int it = 0; it < kMaxIterations && more(); ++it) {
    const std::string shared = absl::StrCat("shared_", rng() % kSharedNames);
    const float version = static_cast<float>(1 + rng() % 1000);
    switch (rng() % 6) {
      case 0: {  // overwrite through PutTensor
        auto put = c.PutTensor(shared, Filled(version), /*overwrite=*/true);
        if (!put.ok()) tally.Problem(absl::StrCat("put ", shared, ": ", put.status().ToString()));
        break;
      }
      case 1: {  // overwrite through Execute: transpose twice, through an intermediate
        v1::ExecuteRequest req;
        AddInline(req, "x", Filled(version));
        AddNode(req, "t", "transpose", {Inline("x")});
        AddNode(req, "tt", "transpose", {Node("t")});
        AddOutput(req, "tt", /*return_inline=*/false, shared, /*overwrite=*/true);
        auto r = c.Execute(req);
        if (!r.ok()) tally.Problem(absl::StrCat("store ", shared, ": ", r.status().ToString()));
        break;
      }
      case 2: {  // read through a kernel: every row the same sum, of one version
        v1::ExecuteRequest req;
        AddNode(req, "s", "row_sum", {Stored(shared)});
        AddOutput(req, "s", true);
        auto r = c.Execute(req);
        if (tally.Failed(r.status(), absl::StrCat("row_sum ", shared))) break;
        ++tally.checked;
        const std::vector<float> sums = Floats(r->outputs(0).tensor().data());
        std::vector<float> versions;
        for (float s : sums) versions.push_back(s / kCols);
        const double v = OneVersion(versions);
        if (v < 0 || static_cast<int64_t>(sums.size()) != RowsOf(v)) {
          tally.Problem(absl::StrCat("row_sum of ", shared, " mixes versions or is wrong: ",
                                     sums.empty() ? 0.f : sums.front(), " .. ",
                                     sums.empty() ? 0.f : sums.back()));
        }
        break;
      }
      case 3: {  // read through a download
        auto t = c.GetTensor(shared);
        if (tally.Failed(t.status(), absl::StrCat("get ", shared))) break;
        ++tally.checked;
        const double v = OneVersion(Floats(t->data));
        if (v < 0 || t->shape != std::vector<int64_t>{RowsOf(v), kCols}) {
          tally.Problem(absl::StrCat("get ", shared, ": not one version whole"));
        }
        break;
      }
      case 4: {  // delete
        (void)tally.Failed(c.DeleteTensor(shared).status(), absl::StrCat("delete ", shared));
        break;
      }
      case 5: {  // read-your-writes, and a private graph whose node ids every client shares
        v1::ExecuteRequest store;
        AddInline(store, "x", Filled(version));
        AddNode(store, "t", "transpose", {Inline("x")});
        AddOutput(store, "t", false, mine, /*overwrite=*/true);
        auto stored = c.Execute(store);
        if (!stored.ok()) {
          tally.Problem(absl::StrCat("store ", mine, ": ", stored.status().ToString()));
          break;
        }
        v1::ExecuteRequest read;
        AddNode(read, "t", "sum", {Stored(mine)});
        AddOutput(read, "t", true);
        std::uniform_real_distribution<float> unit(-1.f, 1.f);
        constexpr int64_t kRows = 64;
        std::vector<float> values(kRows * kCols);
        for (float& v : values) v = unit(rng);
        const client::HostTensor x = F32({kRows, kCols}, values);
        AddInline(read, "x", x);
        AddNode(read, "u", "transpose", {Inline("x")});
        AddNode(read, "r", "row_sum", {Node("u")});
        AddOutput(read, "r", true);
        auto r = c.Execute(read);
        if (!r.ok()) {
          tally.Problem(absl::StrCat("read ", mine, " right after storing it: ",
                                     r.status().ToString()));
          break;
        }
        ++tally.checked;
        for (const v1::NamedTensor& out : r->outputs()) {
          const std::vector<float> got = Floats(out.tensor().data());
          if (out.node() == "t") {
            if (got.size() != 1 || got[0] != version * RowsOf(version) * kCols) {
              tally.Problem(absl::StrCat("sum of ", mine, " is ", got.empty() ? -1 : got[0],
                                         ", stored ", version, " x ", RowsOf(version) * kCols));
            }
            continue;
          }
          // row c of transpose(x) sums column c of x.
          const std::vector<float> xs = Floats(x.data);
          for (int64_t col = 0; col < kCols && got.size() == kCols; ++col) {
            double want = 0, scale = 0;
            for (int64_t row = 0; row < kRows; ++row) {
              want += xs[row * kCols + col];
              scale += std::fabs(xs[row * kCols + col]);
            }
            if (!(std::fabs(got[col] - want) <= 1e-5 * scale)) {
              tally.Problem(absl::StrCat("row_sum(transpose(x)) of client ", id, " column ", col,
                                         ": ", got[col], ", want ", want));
              break;
            }
          }
          if (got.size() != kCols) tally.Problem("row_sum(transpose(x)): wrong length");
        }
        break;
      }
    }
  }
}

TEST_P(LanesTest, ConcurrentClientsSeeWholeVersionsAndTheirOwnWrites) {
  ASSERT_NE(server().Output().find(absl::StrCat("opserve: ", GetParam(),
                                                GetParam() == 1 ? " lane\n" : " lanes\n")),
            std::string::npos)
      << "the server does not run the lanes asked for:\n" << server().Output();
  std::vector<Tally> tallies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(RunClient, server().target(), i, std::ref(tallies[i]));
  }
  for (std::thread& t : clients) t.join();
  int64_t checked = 0;
  for (int i = 0; i < kClients; ++i) {
    checked += tallies[i].checked;
    for (const std::string& p : tallies[i].problems) ADD_FAILURE() << "client " << i << ": " << p;
  }
  EXPECT_GT(checked, kClients * 10) << "too few checked answers to mean anything";
  RecordProperty("checked", std::to_string(checked));
  EXPECT_TRUE(Serving());
}

INSTANTIATE_TEST_SUITE_P(Lanes, LanesTest, ::testing::Values(1, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("lanes_", info.param);
                         });

}  // namespace
}  // namespace opserve::e2e
