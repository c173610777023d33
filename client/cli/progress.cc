#include "client/cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/format.h"

namespace opserve::cli {
namespace {

constexpr int kBarWidth = 30;

void WriteAll(int fd, const std::string& text) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n <= 0) return;  // a closed terminal: nothing to report it to
    written += static_cast<size_t>(n);
  }
}

// A terminal that can return to the line's start and clear it: not TERM=dumb (Emacs' shell),
// which would print the escape sequence.
bool CanDrawOn(int fd) {
  if (isatty(fd) != 1) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::string_view(term) != "dumb";
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int fd)
    : label_(std::move(label)), fd_(fd), terminal_(CanDrawOn(fd)), start_(absl::Now()) {}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!terminal_ || total <= kProgressMinBytes) return;
  const absl::Time now = absl::Now();
  if (done < total && now - last_draw_ < kRedraw) return;
  last_draw_ = now;
  Draw(done, total);
}

void ProgressBar::Draw(uint64_t done, uint64_t total) {
  const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  const int filled = static_cast<int>(fraction * kBarWidth);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  const std::string rate =
      seconds > 0 && done > 0 ? absl::StrFormat(", %.2f GB/s", static_cast<double>(done) / seconds / 1e9) : "";
  // \r returns to the line's start and \033[K clears what a longer previous line left.
  WriteAll(fd_, absl::StrFormat("\r%s [%s%s] %3.0f%% %s / %s%s\033[K", label_,
                                std::string(filled, '#'), std::string(kBarWidth - filled, '.'),
                                fraction * 100, FormatBytes(done), FormatBytes(total), rate));
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!drawn_) return;
  WriteAll(fd_, "\r\033[K");
  drawn_ = false;
}

}  // namespace opserve::cli
