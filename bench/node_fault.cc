// Node section 5, fault isolation: a server over two devices started with
// --test_fail_device=<second>@K, clients on both under load. The first device's requests must
// all succeed; the second's fail from its K-th (INTERNAL, then UNAVAILABLE naming it), and gRPC
// health stays SERVING throughout.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench::node_bench {

std::string Node::Fault() {
  if (!flags_.fail_device) {
    skips_.push_back({"node fault isolation",
                      absl::StrCat(launch_.bin(), " has no --test_fail_device (build it with "
                                                  "-DOPSERVE_TEST_HOOKS=ON)")});
    return "";
  }
  const std::string dev1 = cpu_ ? "cpu:1" : "cuda:1";
  const int k = o_.fail_after;
  NodeServer s;
  if (std::string err = s.Open(launch_.bin(),
                               Args({AllDevicesFlag(), absl::StrCat("--test_fail_device=", dev1, "@", k)}),
                               2);
      !err.empty()) {
    return err;
  }
  if (s.devices.size() < 2 || s.devices[1] != dev1) {
    return absl::StrCat("want two devices, the second ", dev1, "; the server has ",
                        absl::StrJoin(s.devices, ", "));
  }
  const Gen x{v1::FLOAT32, o_.stored_rows, o_.stored_cols, 601};
  std::vector<v1::ExecuteRequest> reqs;
  for (int g = 0; g < 2; ++g) {
    const std::string name = absl::StrCat("f", g);
    PutOutcome p = PutGen(*s.stub, name, x, s.devices[g], false, false, Threads());
    if (!p.status.ok()) return absl::StrCat("PutTensor ", name, ": ", StatusText(p.status));
    reqs.push_back(RowMeanOfStored(name));
  }
  // Each thread's calls in order: ok, or the failure's code and message.
  struct Outcome {
    absl::StatusCode code;
    std::string message;
  };
  const int clients = o_.clients;
  std::vector<std::vector<Outcome>> seen(2 * clients);
  std::atomic<bool> done{false};
  int64_t polls = 0, not_serving = 0;
  std::thread health([&] {  // on a connection of its own
    client::ClientOptions co;
    co.target = absl::StrCat("127.0.0.1:", s.session.server.port());
    auto c = client::Client::Connect(co);
    while (!done.load()) {
      auto h = c.ok() ? (*c)->HealthServing() : absl::StatusOr<bool>(c.status());
      ++polls;
      not_serving += !(h.ok() && *h);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(o_.fault_seconds));
  std::vector<std::thread> pool;
  for (int t = 0; t < 2 * clients; ++t) {
    pool.emplace_back([&, t] {
      const int g = t / clients;
      while (Clock::now() < until) {
        auto r = s.groups[g]->Execute(reqs[g]);
        seen[t].push_back({r.status().code(), std::string(r.status().message())});
      }
    });
  }
  for (std::thread& t : pool) t.join();
  // After the window: each device as a new client finds it.
  auto after0 = s.c().Execute(reqs[0]);
  auto after1 = s.c().Execute(reqs[1]);
  auto health_after = s.c().HealthServing();
  auto ops = s.c().ListOps();
  done = true;
  health.join();

  int64_t ok[2] = {0, 0}, internal = 0, unavailable = 0, unnamed = 0, other = 0, ok_after_fail = 0;
  std::string other_text, unnamed_text;
  for (int t = 0; t < 2 * clients; ++t) {
    const int g = t / clients;
    bool failed = false;
    for (const Outcome& o : seen[t]) {
      if (o.code == absl::StatusCode::kOk) {
        ++ok[g];
        ok_after_fail += failed && g == 1;
        continue;
      }
      failed = true;
      if (g == 0) {
        ++other;
        if (other_text.empty()) other_text = absl::StrCat(s.devices[0], ": ", o.message);
      } else if (o.code == absl::StatusCode::kInternal) {
        ++internal;
      } else if (o.code == absl::StatusCode::kUnavailable) {
        ++unavailable;
        if (!absl::StrContains(o.message, dev1)) {
          ++unnamed;
          if (unnamed_text.empty()) unnamed_text = o.message;
        }
      } else {
        ++other;
        if (other_text.empty()) {
          other_text = absl::StrCat(absl::StatusCodeToString(o.code), ": ", o.message);
        }
      }
    }
  }
  int64_t n0 = 0;
  for (int t = 0; t < clients; ++t) n0 += seen[t].size();
  bool listed_out = false;
  if (ops.ok()) {
    for (const v1::DeviceInfo& d : ops->devices()) listed_out |= d.name() == dev1 && !d.serving();
  }
  const bool after1_named = !after1.ok() &&
                            after1.status().code() == absl::StatusCode::kUnavailable &&
                            absl::StrContains(after1.status().message(), dev1);
  absl::PrintF("  %d clients each on %s and %s for %.1f s, the fault at %s's request %d:\n", clients,
              s.devices[0].c_str(), dev1.c_str(), o_.fault_seconds, dev1.c_str(), k);
  absl::PrintF("    %s: %lld of %lld succeeded%s\n", s.devices[0].c_str(),
              static_cast<long long>(ok[0]), static_cast<long long>(n0),
              other_text.empty() ? "" : absl::StrCat("; first failure ", other_text).c_str());
  absl::PrintF("    %s: %lld succeeded, %lld INTERNAL, %lld UNAVAILABLE (%lld not naming it), %lld "
              "other, %lld successes after a thread's first failure\n",
              dev1.c_str(), static_cast<long long>(ok[1]), static_cast<long long>(internal),
              static_cast<long long>(unavailable), static_cast<long long>(unnamed),
              static_cast<long long>(other), static_cast<long long>(ok_after_fail));
  absl::PrintF("    after: %s %s; %s %s; ListOps lists %s %s; health polls %lld, not SERVING %lld\n",
              s.devices[0].c_str(), after0.ok() ? "OK" : StatusText(after0.status()).c_str(),
              dev1.c_str(), after1.ok() ? "OK" : StatusText(after1.status()).c_str(), dev1.c_str(),
              listed_out ? "not serving" : "serving (or absent)", static_cast<long long>(polls),
              static_cast<long long>(not_serving));
  const std::string where = cpu_ ? " (cpu)" : "";
  Correct(absl::StrCat("node fault", where, ": ", s.devices[0], "'s requests all succeed while ",
                       dev1, " fails"),
          absl::StrFormat("%d of %d, then %s", ok[0], n0,
                          after0.ok() ? "OK" : StatusText(after0.status())),
          ok[0] == n0 && n0 > 0 && after0.ok());
  // The K - 1 before the fault succeed; so may requests already queued there when it hit (at
  // most one a client: each waits for its answer), as a device without sticky errors (the CPU)
  // finishes them; none after a client's first failure.
  const bool fails_right = internal >= 1 && other == 0 && unnamed == 0 && ok_after_fail == 0 &&
                           ok[1] >= k - 1 && ok[1] <= k - 1 + (clients - 1) && after1_named &&
                           listed_out;
  Correct(absl::StrCat("node fault", where, ": ", dev1,
                       " fails from its K-th request (INTERNAL, then UNAVAILABLE naming it)"),
          absl::StrFormat("%d ok (K-1 = %d), %d INTERNAL, %d UNAVAILABLE; after: %s", ok[1], k - 1,
                          internal, unavailable,
                          after1.ok() ? "OK" : StatusText(after1.status())) +
              (unnamed_text.empty() ? "" : absl::StrCat("; unnamed: ", unnamed_text)) +
              (other_text.empty() ? "" : absl::StrCat("; other: ", other_text)),
          fails_right);
  Correct(absl::StrCat("node fault", where, ": gRPC health SERVING throughout and after"),
          absl::StrFormat("%d of %d polls not SERVING; after: %s", not_serving, polls,
                          health_after.ok() ? (*health_after ? "SERVING" : "NOT_SERVING")
                                            : StatusText(health_after.status())),
          not_serving == 0 && polls > 0 && health_after.ok() && *health_after);
  return "";
}

}  // namespace opserve::bench::node_bench
