// The infer request's JSON in one pass of RapidJSON's SAX reader. A 10x2048 FP32 tensor as "data"
// is 20,480 numbers in ~400 KB of text; a DOM gives each a 16-byte value and a second walk to
// encode it, a tenth of the parse's time. Here each input's "data" goes from the reader's number
// events straight into its element bytes, and only the rest of the request (names, shapes,
// parameters, outputs) becomes a Document. What remains is RapidJSON's number parse itself, ~30 ns
// for each of those 17-digit numbers: neither its kParseNumbersAsStringsFlag (the digits are still
// scanned the same way) with std::from_chars (GCC 12's, ~18 ns a number on its own), nor its
// recursive parse, measured faster.
//
// "data" is taken that way when the input's "datatype" came before it, as tritonclient and
// json.dumps of its dicts write them; otherwise it stays in the Document and EncodeData encodes
// it from there afterwards, through the same DataWriter, so both ways give the same bytes and
// the same errors.
#pragma once

#include <rapidjson/document.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace opserve::http {

// Arrays in "data" nested deeper than a tensor's dimensions are refused: the walk of a
// Document's "data" recurses, and stays shallow.
inline constexpr int kMaxDataDepth = 64;

// The elements of one "data" value (nested arrays flattened, as the protocol allows) as the
// datatype's little-endian bytes, from RapidJSON's handler events. An element of the wrong
// kind is a fault, remembered with its index; after it the events are only counted, to find
// the value's end (`stop_at_fault`: the handler answers false instead, which ends a walk).
class DataWriter {
 public:
  DataWriter(DType dtype, bool stop_at_fault) : dtype_(dtype), stop_at_fault_(stop_at_fault) {}

  bool Null() { return Other(); }
  bool Bool(bool) { return Other(); }
  bool Int(int v) { return Integer(v); }
  bool Uint(unsigned v) { return Integer(v); }
  bool Int64(int64_t v) { return Integer(v); }
  bool Uint64(uint64_t v);
  bool Double(double v);
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return Other(); }
  bool String(const char*, rapidjson::SizeType, bool) { return Other(); }
  bool StartObject();
  bool Key(const char*, rapidjson::SizeType, bool) { return true; }
  bool EndObject(rapidjson::SizeType) { return Close(); }
  bool StartArray();
  bool EndArray(rapidjson::SizeType) { return Close(); }

  // The value has ended: its last event came.
  bool done() const { return open_ == 0 && started_; }
  // INVALID_ARGUMENT naming `what` (the input) and the fault, else the bytes into `bytes`.
  absl::Status Finish(const std::string& what, std::string* bytes);

 private:
  enum class Fault { kNone, kNotElement, kTooDeep };

  bool Integer(int64_t v);
  bool Other();  // an element that is no number, or an object
  bool Close();
  bool SetFault(Fault f);
  template <typename T>
  void Put(T v);

  const DType dtype_;
  const bool stop_at_fault_;
  std::string bytes_;  // its first used_ bytes are the elements so far
  uint64_t used_ = 0;
  uint64_t count_ = 0;  // elements so far
  int open_ = 0;        // arrays (and, after a fault, objects) open in the value
  bool started_ = false;
  Fault fault_ = Fault::kNone;
  uint64_t fault_index_ = 0;
};

// `header` as `doc` (an object, or INVALID_ARGUMENT as ParseJson says it). inputs[i]'s first
// "data", where the parse took it, is in `(*taken)[i]` (the Document holds null in its place):
// its faults wait there for Finish, so that the request's other errors come first in the
// order the caller checks them, as they did with the whole Document.
absl::Status ParseInferJson(std::string_view header, rapidjson::Document* doc,
                            std::vector<std::optional<DataWriter>>* taken);

// `v` (a Document's "data") as `dtype`'s bytes, or INVALID_ARGUMENT naming `what`.
absl::Status EncodeData(const rapidjson::Value& v, DType dtype, const std::string& what,
                        std::string* out);

// bfloat16 from float, rounded to nearest even (NaN stays a quiet NaN), and back.
uint16_t ToBFloat16(float f);
float FromBFloat16(uint16_t h);

}  // namespace opserve::http
