// The timeline of each graph call (--trace_requests=PATH): the moment it passes each hand-over,
// from its receipt to gRPC's OnDone, written as CSV when the server stops. The response's timing
// (queue, compute, total) sums these stages up; the timeline shows which of them a request
// waits in under load, and how requests arrive (scripts/trace-stages.py summarises a file).
// Recording costs a clock read per stage; the first `capacity` calls are kept.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace opserve {

class RequestTrace {
 public:
  // In the order a call that succeeds passes them (request.h names the threads).
  enum Stage : int {
    kReceived,     // the handler has the request
    kPlanned,      // planned, handed to the device worker
    kLaunchBegin,  // a lane took it
    kLaunchEnd,    // its device work is queued
    kWaitBegin,    // a completion thread took it and waits for the device
    kCompleted,    // outputs copied, kept tensors committed
    kReplyBegin,   // its context is free; the response is built
    kFinished,     // handed to gRPC
    kDone,         // gRPC is done with it (OnDone)
    kNumStages
  };
  static constexpr std::array<const char*, kNumStages> kStageNames = {
      "received", "planned", "launch_begin", "launch_end", "wait_begin",
      "completed", "reply_begin", "finished", "done"};

  class Record {
   public:
    void Mark(Stage stage) {
      ns_[stage] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
    }

   private:
    friend class RequestTrace;
    absl::string_view rpc_;
    std::array<int64_t, kNumStages> ns_{};  // 0: not reached (the call failed before)
  };

  explicit RequestTrace(size_t capacity) : records_(capacity) {}

  // The record of one call of `rpc` (a literal); nullptr once `capacity` calls have one.
  Record* Add(absl::string_view rpc);
  // Every record taken, a line each: the rpc, then each stage's steady-clock nanoseconds. Call
  // it once no call is running (their stages are written by the threads that run them).
  absl::Status WriteCsv(const std::string& path) const;

 private:
  std::vector<Record> records_;
  std::atomic<size_t> next_{0};
};

}  // namespace opserve
