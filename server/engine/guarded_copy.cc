#include "server/engine/guarded_copy.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace opserve {
namespace {

// The copy a thread is inside, read by the handler on that same thread.
struct Guard {
  sigjmp_buf env;
  const char* ranges[2][2];  // [source, destination] x [begin, end)
  const char* volatile fault = nullptr;  // written by the handler, read after the jump
};
thread_local Guard* t_guard = nullptr;
struct sigaction g_previous;

bool Inside(const Guard& g, const char* a) {
  for (const auto& r : g.ranges) {
    if (a >= r[0] && a < r[1]) return true;
  }
  return false;
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  Guard* g = t_guard;
  const char* addr = static_cast<const char*>(info->si_addr);
  // si_code > 0: raised by the kernel for this thread's access (for a SIGBUS sent by kill(),
  // si_addr holds no address).
  if (g != nullptr && info->si_code > 0 && Inside(*g, addr)) {
    g->fault = addr;
    siglongjmp(g->env, 1);
  }
  // Not a guarded copy: what would have happened without this handler.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action. A fault re-runs its access on return and ends the process then; a sent
  // signal is raised again, to be delivered once the handler returns.
  signal(sig, SIG_DFL);
  if (info->si_code <= 0) raise(sig);
}

void Install() {
  struct sigaction sa {};
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

absl::Status GuardedCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  static std::once_flag installed;
  std::call_once(installed, Install);
  Guard g;
  const char* s = static_cast<const char*>(src);
  const char* d = static_cast<const char*>(dst);
  g.ranges[0][0] = s;
  g.ranges[0][1] = s + bytes;
  g.ranges[1][0] = d;
  g.ranges[1][1] = d + bytes;
  // savemask: the handler runs with SIGBUS blocked, and the jump must unblock it again.
  if (sigsetjmp(g.env, 1) != 0) {
    t_guard = nullptr;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    const char* fault = g.fault;
    const bool in_source = fault >= s && fault < s + bytes;
    return absl::InvalidArgumentError(absl::StrCat(
        "the copy's ", in_source ? "source" : "destination", " went away under it at byte ",
        fault - (in_source ? s : d), " of ", bytes,
        " (a shared memory object truncated while the request ran)"));
  }
  t_guard = &g;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return absl::OkStatus();
}

}  // namespace opserve
