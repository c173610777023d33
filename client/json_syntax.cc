#include "client/json_syntax.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace opserve::client {
namespace {

// Deeper than any graph needs, and bounded so hostile input cannot exhaust the stack.
constexpr int kMaxDepth = 256;

class Checker {
 public:
  Checker(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}

  absl::Status Run() {
    SkipSpace();
    if (!Value(0)) return error_;
    SkipSpace();
    if (pos_ < text_.size()) {
      Fail("the end of the text after the value");
      return error_;
    }
    return absl::OkStatus();
  }

 private:
  // What stands at pos_, for the message.
  std::string Found() const {
    if (pos_ >= text_.size()) return "the end of the text";
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c < 0x20 || c >= 0x7f) return absl::StrFormat("byte 0x%02x", c);
    return absl::StrCat("'", text_.substr(pos_, 1), "'");
  }

  bool Fail(absl::string_view expected) {
    const absl::string_view before = text_.substr(0, std::min(pos_, text_.size()));
    const size_t line = std::count(before.begin(), before.end(), '\n') + 1;
    const size_t line_start = before.rfind('\n');
    const size_t column = line_start == absl::string_view::npos ? pos_ + 1 : pos_ - line_start;
    error_ = absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ":", column,
                                                     ": not valid JSON: expected ", expected,
                                                     ", found ", Found()));
    return false;
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool Peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  bool Digit() const { return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; }

  bool Value(int depth) {
    if (depth > kMaxDepth) return Fail(absl::StrCat("at most ", kMaxDepth, " levels of nesting"));
    if (pos_ >= text_.size()) return Fail("a value");
    switch (text_[pos_]) {
      case '{': return Object(depth);
      case '[': return Array(depth);
      case '"': return String();
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default:
        if (text_[pos_] == '-' || Digit()) return Number();
        return Fail("a value");
    }
  }

  bool Literal(absl::string_view word) {
    for (char c : word) {
      if (!Peek(c)) return Fail(absl::StrCat("'", word, "'"));
      ++pos_;
    }
    return true;
  }

  bool Number() {
    if (Peek('-')) ++pos_;
    if (Peek('0')) {
      ++pos_;
    } else if (Digit()) {
      while (Digit()) ++pos_;
    } else {
      return Fail("a digit");
    }
    if (Peek('.')) {
      ++pos_;
      if (!Digit()) return Fail("a digit after '.'");
      while (Digit()) ++pos_;
    }
    if (Peek('e') || Peek('E')) {
      ++pos_;
      if (Peek('+') || Peek('-')) ++pos_;
      if (!Digit()) return Fail("a digit in the exponent");
      while (Digit()) ++pos_;
    }
    return true;
  }

  bool String() {
    ++pos_;  // the opening quote
    while (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("'\"' or a character (control characters must be escaped)");
      if (c == '\\') {
        ++pos_;
        if (pos_ >= text_.size()) break;
        const char e = text_[pos_];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i) {
            ++pos_;
            if (pos_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[pos_])))
              return Fail("four hex digits after \\u");
          }
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return Fail("an escape: one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX");
        }
      }
      ++pos_;
    }
    return Fail("'\"' to end the string");
  }

  bool Array(int depth) {
    ++pos_;
    SkipSpace();
    if (Peek(']')) {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (!Value(depth + 1)) return false;
      SkipSpace();
      if (Peek(']')) {
        ++pos_;
        return true;
      }
      if (!Peek(',')) return Fail("',' or ']' after a list element");
      ++pos_;
    }
  }

  bool Object(int depth) {
    ++pos_;
    SkipSpace();
    if (Peek('}')) {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (!Peek('"')) return Fail("a member name in double quotes");
      if (!String()) return false;
      SkipSpace();
      if (!Peek(':')) return Fail("':' after a member name");
      ++pos_;
      SkipSpace();
      if (!Value(depth + 1)) return false;
      SkipSpace();
      if (Peek('}')) {
        ++pos_;
        return true;
      }
      if (!Peek(',')) return Fail("',' or '}' after an object member");
      ++pos_;
    }
  }

  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
  absl::Status error_;
};

}  // namespace

absl::Status CheckJsonSyntax(absl::string_view json, absl::string_view source) {
  return Checker(json, source).Run();
}

}  // namespace opserve::client
