// A progress bar for opserve-cli's transfers, drawn on stderr.
//
// Only for a person watching: stderr must be a terminal (not TERM=dumb) and the transfer over
// kProgressMinBytes. Piped or redirected output (scripts, logs, CI) never sees it, and a small
// transfer ends before a bar would be read.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace opserve::cli {

inline constexpr uint64_t kProgressMinBytes = 64ull << 20;

class ProgressBar {
 public:
  // `label` starts the line, e.g. "put A". `fd` is where it draws (stderr); the bar stays off
  // unless it is a terminal.
  explicit ProgressBar(std::string label, int fd = 2);
  ~ProgressBar() { Finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // The client library's progress callback: draws at most every kRedraw, and at the end.
  void Update(uint64_t done, uint64_t total);
  // Clears the bar's line, so that what follows starts on a clean one.
  void Finish();

 private:
  static constexpr absl::Duration kRedraw = absl::Milliseconds(100);
  void Draw(uint64_t done, uint64_t total);

  std::string label_;
  int fd_;
  bool terminal_;
  bool drawn_ = false;
  absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
};

}  // namespace opserve::cli
