#include "server/engine/warmup.h"

#include <future>
#include <latch>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/ops/op.h"
#include "common/status_macros.h"

namespace opserve {
namespace {

// Square sides, ascending: small, medium and large enough to reach each launcher's
// shape-dependent variants (few vs many rows, split rows, tile counts, cuBLAS's heuristics, the
// wgmma path of tensor_core_sm90a). The largest runs only where the medium one took under
// kLargeIfUnder: a teaching matmul would take ~0.3 s at 4096^3.
constexpr int64_t kSides[] = {64, 1024, 4096};
constexpr double kLargeIfUnder = 200e-6;  // seconds

absl::StatusOr<int> RunAll(Backend& backend, ExecEnv& env) {
  int runs = 0;
  const AttrMap no_attrs;
  for (const OpSpec& op : Ops()) {
    for (const AlgoSpec* algo : AlgorithmsFor(op.name, backend)) {
      for (DType dtype : algo->dtypes) {
        double previous_s = 0;
        for (int64_t n : kSides) {
          if (n == kSides[2] && previous_s > kLargeIfUnder) break;
          std::vector<TensorMeta> in(op.arity, TensorMeta{dtype, {n, n}});
          auto out = op.infer(in);
          if (!out.ok()) continue;  // an op that takes no square inputs of this dtype
          // A shape the row does not take runs its fallback row, which is warmed up on its own.
          if (algo->supports != nullptr && !algo->supports(in)) continue;
          // A small --memory_budget_bytes skips the shapes that do not fit.
          std::vector<BufferPtr> buffers;
          std::vector<const void*> ptrs;
          bool fits = true;
          for (const TensorMeta& m : in) {
            auto b = env.Allocate(m.Bytes());
            if (!b.ok() && absl::IsResourceExhausted(b.status())) fits = false;
            if (!fits) break;
            if (!b.ok()) return b.status();
            ptrs.push_back((*b)->data());
            buffers.push_back(*std::move(b));
          }
          auto o = fits ? env.Allocate(out->Bytes()) : absl::ResourceExhaustedError("");
          if (!o.ok() && absl::IsResourceExhausted(o.status())) continue;
          if (!o.ok()) return o.status();
          env.BeginRequest(1);
          KernelArgs args{ptrs, in, (*o)->data(), *out, no_attrs, env};
          // A first launch includes loading the kernel: the medium side runs a second time when
          // the first looked too slow, so that the load does not decide the large side.
          for (int attempt = 0; attempt < (n == kSides[1] ? 2 : 1); ++attempt) {
            env.MarkStart(0);
            absl::Status s = algo->run(args);
            env.MarkEnd(0);
            auto seconds = env.Finish(1);
            if (!s.ok()) return absl::Status(s.code(), absl::StrCat(op.name, "/", algo->name, ": ", s.message()));
            RETURN_IF_ERROR(seconds.status());
            previous_s = (*seconds)[0];
            ++runs;
            if (previous_s <= kLargeIfUnder) break;
          }
        }
      }
    }
  }
  return runs;
}

}  // namespace

absl::StatusOr<int> WarmUpKernels(Device& device) {
  // One job per lane, each held at the latch until every lane has taken one: so each lane's
  // context (its cuBLAS handle, its scratch and staging) is warmed, not one lane n times.
  const int lanes = device.lanes();
  std::latch all_taken(lanes);
  std::vector<std::promise<absl::StatusOr<int>>> results(lanes);
  absl::Status status;
  int submitted = 0;
  for (; submitted < lanes; ++submitted) {
    const int i = submitted;
    status = device.Submit([&, i](ExecEnv& env) {
      all_taken.arrive_and_wait();
      results[i].set_value(RunAll(device.backend(), env));
    });
    if (!status.ok()) {
      all_taken.count_down(lanes - i);  // release the jobs already taken
      break;
    }
  }
  int runs = 0;
  for (int i = 0; i < submitted; ++i) {
    absl::StatusOr<int> n = results[i].get_future().get();
    if (n.ok()) runs += *n;
    status.Update(n.status());
  }
  if (!status.ok()) return status;
  return runs;
}

}  // namespace opserve
