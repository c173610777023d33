// Dynamic batching (--max_batch_size; server/engine/batch.h), on whatever backend
// $OPSERVE_TEST_DEVICE names. One lane of one context makes concurrent calls wait for the
// device together, so they batch. Each call's graph has an intermediate and its own random
// inputs (stored, or inline), so a batch that mixed up members' inputs, outputs or node
// reports would show in the numbers; calls that store an output, and calls that move more than
// kMaxBatchableBytes, never batch.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::e2e {
namespace {

constexpr int kThreads = 12;
constexpr int kCallsPerThread = 40;
constexpr int64_t kCols = 40;
// Tiny calls of 24 rows; big ones of 8192 rows (1.25 MiB in, and as much through the
// transpose), over the engine's kMaxBatchableBytes.
constexpr int64_t kTinyRows = 24, kBigRows = 8192;

class BatchTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--lanes=1", "--lane_contexts=1", "--max_batch_size=8"};
  }
};

std::vector<float> RandomValues(std::mt19937_64& rng, int64_t rows) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(rows * kCols);
  for (float& x : v) x = u(rng);
  return v;
}

// row_mean(transpose(X)): the mean of each of X's columns, in float64.
std::vector<double> ColumnMeans(const std::vector<float>& x) {
  const int64_t rows = static_cast<int64_t>(x.size()) / kCols;
  std::vector<double> m(kCols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) m[c] += x[r * kCols + c];
  }
  for (double& v : m) v /= rows;
  return m;
}

// The graph every thread sends, on its own input: stored, inline, stored and kept, or big.
enum class Kind { kStored, kInline, kKept, kBig };
v1::ExecuteRequest Graph(Kind kind, const std::string& x, const std::vector<float>& values) {
  v1::ExecuteRequest r;
  const int64_t rows = static_cast<int64_t>(values.size()) / kCols;
  if (kind == Kind::kInline) AddInline(r, "x", F32({rows, kCols}, values));
  AddNode(r, "t", "transpose", {kind == Kind::kInline ? Inline("x") : Stored(x)});
  AddNode(r, "m", "row_mean", {Node("t")});
  AddOutput(r, "m", true, kind == Kind::kKept ? absl::StrCat(x, "_kept") : "", true);
  return r;
}

struct Seen {
  int64_t checked = 0, batched = 0, biggest = 0, refused = 0;
  std::vector<std::string> problems;
};

// Every thread's figures together, each thread's problems reported as failures.
Seen Total(const std::vector<Seen>& seen) {
  Seen all;
  for (const Seen& s : seen) {
    for (const std::string& p : s.problems) ADD_FAILURE() << p;
    all.checked += s.checked;
    all.batched += s.batched;
    all.refused += s.refused;
    all.biggest = std::max(all.biggest, s.biggest);
  }
  return all;
}

// A client of its own for one thread, or nullptr with the reason in `s`.
std::unique_ptr<client::Client> Connect(const std::string& target, Seen& s) {
  client::ClientOptions options;
  options.target = target;
  options.timeout = absl::Seconds(60);
  auto c = client::Client::Connect(options);
  if (!c.ok()) {
    s.problems.push_back(c.status().ToString());
    return nullptr;
  }
  return *std::move(c);
}

// Runs `body(t, s, rng, client, name)` on `n` threads at once, thread t with a client of its
// own, random numbers seeded `seed + t` and the tensor name "x<t>"; returns their tally.
template <typename Body>
Seen RunClients(const std::string& target, int n, uint64_t seed, Body body) {
  std::vector<Seen> seen(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      Seen& s = seen[t];
      std::mt19937_64 rng(seed + t);
      std::unique_ptr<client::Client> c = Connect(target, s);
      if (c != nullptr) body(t, s, rng, *c, absl::StrCat("x", t));
    });
  }
  for (std::thread& th : threads) th.join();
  return Total(seen);
}

// Whether `r`'s one output holds the column means of `values`; if not, says why in `s`.
bool HasColumnMeans(const std::string& at, const v1::ExecuteResponse& r,
                    const std::vector<float>& values, Seen& s) {
  const std::string& data = r.outputs(0).tensor().data();
  if (data.size() != kCols * sizeof(float)) {
    s.problems.push_back(at + "output of " + std::to_string(data.size()) + " bytes");
    return false;
  }
  const std::vector<double> want = ColumnMeans(values);
  const float* got = reinterpret_cast<const float*>(data.data());
  for (int64_t col = 0; col < kCols; ++col) {
    if (!(std::fabs(got[col] - want[col]) <= 1e-5)) {  // NaN fails
      s.problems.push_back(absl::StrCat(at, "column ", col, ": ", got[col], " against ",
                                        want[col], " (batch of ", r.batch_size(), ")"));
      return true;  // answered with the right size: counted, its problem reported
    }
  }
  return true;
}

TEST_F(BatchTest, CallsThatWaitTogetherRunAsOneAndEachGetsItsOwnResult) {
  auto calls = [&](int t, Seen& s, std::mt19937_64& rng, client::Client& c,
                   const std::string& x) {
    // Two threads each of the kinds that never batch, so that they could batch with each other.
    const Kind kind = t == 3 || t == 5  ? Kind::kKept
                    : t == 7 || t == 11 ? Kind::kBig
                    : t % 2 == 0 ? Kind::kStored
                                 : Kind::kInline;
    for (int i = 0; i < kCallsPerThread && s.problems.size() < 3; ++i) {
      // A new input every call: a member given another's input or output would not match.
      const int64_t rows = kind == Kind::kBig ? kBigRows : kTinyRows;
      const std::vector<float> values = RandomValues(rng, rows);
      if (kind != Kind::kInline) {
        absl::Status put = c.PutTensor(x, F32({rows, kCols}, values), true).status();
        if (!put.ok()) {
          s.problems.push_back(absl::StrCat("PutTensor: ", put.ToString()));
          continue;
        }
      }
      absl::StatusOr<v1::ExecuteResponse> r = c.Execute(Graph(kind, x, values));
      if (!r.ok()) {
        s.problems.push_back(absl::StrCat("Execute: ", r.status().ToString()));
        continue;
      }
      const std::string at = absl::StrCat("thread ", t, " call ", i, ": ");
      if (r->nodes_size() != 2 || r->nodes(0).id() != "t" || r->nodes(1).id() != "m" ||
          r->outputs_size() != 1 || r->outputs(0).node() != "m") {
        s.problems.push_back(at + "nodes or outputs not its own: " + r->ShortDebugString());
        continue;
      }
      if ((kind == Kind::kKept || kind == Kind::kBig) && r->batch_size() != 1) {
        s.problems.push_back(at + "a call that stores or moves over a MiB ran in a batch of " +
                             std::to_string(r->batch_size()));
      }
      if (r->batch_size() < 1 || r->batch_size() > 8) {
        s.problems.push_back(at + "batch_size " + std::to_string(r->batch_size()));
      }
      if (!HasColumnMeans(at, *r, values, s)) continue;
      ++s.checked;
      if (r->batch_size() > 1) ++s.batched;
      s.biggest = std::max<int64_t>(s.biggest, r->batch_size());
    }
  };
  const Seen all = RunClients(server().target(), kThreads, 1000, calls);
  std::cout << "[ BATCHES  ] " << all.batched << " of " << all.checked
            << " calls ran in a batch; the biggest held " << all.biggest << std::endl;
  EXPECT_EQ(all.checked, kThreads * kCallsPerThread);
  // Twelve clients on one lane of one context: calls wait for the device together.
  EXPECT_GT(all.batched, 0) << "no call ran in a batch";
}

// A batch counts once against --max_inflight, whatever its size: with room for two jobs (one
// running, one waiting) calls join the waiting batch beyond that limit, and a call that would
// start a third job is refused with RESOURCE_EXHAUSTED naming the flag. Were each member
// counted, no batch could hold more than two calls.
class BatchInflightTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--lanes=1", "--lane_contexts=1", "--max_inflight=2", "--max_batch_size=8"};
  }
};

TEST_F(BatchInflightTest, ABatchCountsOnceAgainstTheInflightLimit) {
  constexpr int kClients = 10, kCalls = 40;
  auto calls = [&](int t, Seen& s, std::mt19937_64& rng, client::Client& c,
                   const std::string& x) {
    for (int i = 0; i < kCalls && s.problems.size() < 3; ++i) {
      const std::vector<float> values = RandomValues(rng, kTinyRows);
      absl::Status put = c.PutTensor(x, F32({kTinyRows, kCols}, values), true).status();
      if (!put.ok()) {
        s.problems.push_back(absl::StrCat("PutTensor: ", put.ToString()));
        continue;
      }
      absl::StatusOr<v1::ExecuteResponse> r = c.Execute(Graph(Kind::kStored, x, values));
      const std::string at = absl::StrCat("client ", t, " call ", i, ": ");
      if (r.status().code() == absl::StatusCode::kResourceExhausted) {
        if (r.status().message().find("--max_inflight=2") == absl::string_view::npos) {
          s.problems.push_back(at + "refused without naming the limit: " + r.status().ToString());
        }
        ++s.refused;
        continue;
      }
      if (!r.ok()) {
        s.problems.push_back(at + r.status().ToString());
        continue;
      }
      if (!HasColumnMeans(at, *r, values, s)) continue;
      ++s.checked;
      s.biggest = std::max<int64_t>(s.biggest, r->batch_size());
    }
  };
  const Seen all = RunClients(server().target(), kClients, 2000, calls);
  std::cout << "[ BATCHES  ] " << all.checked << " calls answered, " << all.refused
            << " refused; the biggest batch held " << all.biggest << std::endl;
  EXPECT_EQ(all.checked + all.refused, kClients * kCalls);
  EXPECT_GT(all.biggest, 2) << "no batch held more calls than --max_inflight=2";
}

// Without the flag every call runs alone and says so.
class UnbatchedTest : public OpserveTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--lanes=1"}; }
};

TEST_F(UnbatchedTest, ACallRunsAloneByDefault) {
  std::mt19937_64 rng(7);
  const std::vector<float> values = RandomValues(rng, kTinyRows);
  absl::StatusOr<v1::ExecuteResponse> r = client().Execute(Graph(Kind::kInline, "x", values));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->batch_size(), 1u);
}

}  // namespace
}  // namespace opserve::e2e
