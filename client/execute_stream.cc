#include "client/execute_stream.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace opserve::client {

absl::Status DriveExecuteStream(Client& client, const v1::ExecuteRequest& request, int inflight,
                                const std::function<bool()>& more,
                                const std::function<void(const StreamAnswer&)>& answered,
                                const CallOptions& call) {
  using Clock = std::chrono::steady_clock;
  inflight = std::max(1, inflight);
  grpc::ClientContext context;
  auto stream = client.ExecuteStream(&context, call);
  // Each request in flight holds a slot; its id is the slot's number, which the answer brings
  // back to find when it was sent.
  std::mutex mu;
  std::condition_variable room;
  std::vector<int> free_slots;
  for (int i = inflight - 1; i >= 0; --i) free_slots.push_back(i);
  std::vector<Clock::time_point> sent(inflight);
  bool reader_done = false;
  std::thread reader([&] {
    v1::ExecuteStreamResponse response;
    while (stream->Read(&response)) {
      const Clock::time_point now = Clock::now();
      int slot = -1;
      if (!absl::SimpleAtoi(response.id(), &slot) || slot < 0 || slot >= inflight) {
        context.TryCancel();  // not an answer to this stream's requests: stop it
        break;
      }
      answered({std::chrono::duration<double, std::micro>(now - sent[slot]).count(), response});
      std::lock_guard lock(mu);
      free_slots.push_back(slot);
      room.notify_one();
    }
    std::lock_guard lock(mu);
    reader_done = true;
    room.notify_one();
  });
  v1::ExecuteStreamRequest message;
  *message.mutable_request() = request;
  std::vector<std::string> ids;
  for (int i = 0; i < inflight; ++i) ids.push_back(absl::StrCat(i));
  for (;;) {
    int slot;
    bool another = false;
    {
      std::unique_lock lock(mu);
      room.wait(lock, [&] { return !free_slots.empty() || reader_done; });
      if (reader_done || !more()) break;
      slot = free_slots.back();
      free_slots.pop_back();
      another = !free_slots.empty();
      sent[slot] = Clock::now();
    }
    message.set_id(ids[slot]);
    // With another slot free, the next request (or WritesDone) follows at once: this one may
    // wait in gRPC's buffer for it, and both leave in one write.
    if (!stream->Write(message,
                       another ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions())) {
      break;
    }
  }
  stream->WritesDone();
  reader.join();
  const grpc::Status s = stream->Finish();
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("ExecuteStream: ", s.error_message()));
}

}  // namespace opserve::client
