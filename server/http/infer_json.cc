#include "server/http/infer_json.h"

#include <rapidjson/encodedstream.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/http/json_proto.h"

namespace opserve::http {

uint16_t ToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float FromBFloat16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
void DataWriter::Put(T v) {
  if (used_ + sizeof(T) > bytes_.size()) {
    bytes_.resize(std::max<uint64_t>(4096, 2 * bytes_.size()));
  }
  std::memcpy(bytes_.data() + used_, &v, sizeof(T));
  used_ += sizeof(T);
  ++count_;
  started_ = true;
}

bool DataWriter::SetFault(Fault f) {
  started_ = true;
  if (fault_ == Fault::kNone) {
    fault_ = f;
    fault_index_ = count_;
  }
  return !stop_at_fault_;
}

bool DataWriter::Other() { return SetFault(Fault::kNotElement); }

// Floating point elements take any number: integers as the double they are, then the
// element's type, as a Document's GetDouble gave them.
bool DataWriter::Double(double v) {
  if (fault_ != Fault::kNone) return true;
  switch (dtype_) {
    case DType::kFloat32:
      Put(static_cast<float>(v));
      return true;
    case DType::kBFloat16:
      Put(ToBFloat16(static_cast<float>(v)));
      return true;
    default:
      return SetFault(Fault::kNotElement);  // 1.0 is no integer element, as IsInt says
  }
}

bool DataWriter::Integer(int64_t v) {
  if (fault_ != Fault::kNone) return true;
  switch (dtype_) {
    case DType::kInt32:
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        return SetFault(Fault::kNotElement);
      }
      Put(static_cast<int32_t>(v));
      return true;
    case DType::kInt64:
      Put(v);
      return true;
    default:
      return Double(static_cast<double>(v));
  }
}

bool DataWriter::Uint64(uint64_t v) {
  if (fault_ != Fault::kNone) return true;
  if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Integer(static_cast<int64_t>(v));
  }
  if (dtype_ == DType::kFloat32 || dtype_ == DType::kBFloat16) {
    return Double(static_cast<double>(v));
  }
  return SetFault(Fault::kNotElement);
}

bool DataWriter::StartObject() {
  const bool go_on = Other();
  ++open_;
  return go_on;
}

bool DataWriter::StartArray() {
  started_ = true;
  const bool go_on = open_ == kMaxDataDepth ? SetFault(Fault::kTooDeep) : true;
  ++open_;
  return go_on;
}

bool DataWriter::Close() {
  --open_;
  return true;
}

absl::Status DataWriter::Finish(const std::string& what, std::string* bytes) {
  switch (fault_) {
    case Fault::kNone:
      break;
    case Fault::kTooDeep:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": 'data' nests arrays more than ", kMaxDataDepth, " deep"));
    case Fault::kNotElement: {
      const char* want = dtype_ == DType::kInt32   ? "a 32-bit integer"
                         : dtype_ == DType::kInt64 ? "a 64-bit integer"
                                                   : "a number";
      return absl::InvalidArgumentError(absl::StrCat(what, ": data element ", fault_index_,
                                                     " is not ", want, " (datatype ",
                                                     OipName(dtype_), ")"));
    }
  }
  bytes_.resize(used_);
  *bytes = std::move(bytes_);
  return absl::OkStatus();
}

namespace {

using Document = rapidjson::Document;

// The reader's events into the Document, but for the inputs' "data" that a DataWriter takes.
// It follows just enough of the request's shape to know where it is: the root object's first
// "inputs" array (depth 2), its objects (depth 3) and their first "datatype" and "data"
// members (the ones a Document's FindMember gives).
class Splitter {
 public:
  Splitter(Document& doc, std::vector<std::optional<DataWriter>>& taken)
      : doc_(doc), taken_(taken) {}

  bool Null() {
    return Value([](auto& h) { return h.Null(); });
  }
  bool Bool(bool v) {
    return Value([v](auto& h) { return h.Bool(v); });
  }
  bool Int(int v) {
    return Value([v](auto& h) { return h.Int(v); });
  }
  bool Uint(unsigned v) {
    return Value([v](auto& h) { return h.Uint(v); });
  }
  bool Int64(int64_t v) {
    return Value([v](auto& h) { return h.Int64(v); });
  }
  bool Uint64(uint64_t v) {
    return Value([v](auto& h) { return h.Uint64(v); });
  }
  bool Double(double v) {
    return Value([v](auto& h) { return h.Double(v); });
  }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool copy) {
    return Value([=](auto& h) { return h.RawNumber(s, n, copy); });
  }
  bool String(const char* s, rapidjson::SizeType n, bool copy) {
    if (writer_ == nullptr && pending_ == Slot::kDatatype) dtype_ = DTypeFromOipName({s, n});
    return Value([=](auto& h) { return h.String(s, n, copy); });
  }
  bool StartObject() {
    const bool input = writer_ == nullptr && in_inputs_ && depth_ == 2;
    if (!Value([](auto& h) { return h.StartObject(); })) return false;
    if (writer_ != nullptr) return true;
    ++depth_;
    if (input) {
      in_input_ = true;
      datatype_seen_ = data_seen_ = false;
      dtype_.reset();
    }
    return true;
  }
  bool Key(const char* s, rapidjson::SizeType n, bool copy) {
    if (writer_ != nullptr) return Forward([=](auto& h) { return h.Key(s, n, copy); });
    const std::string_view key(s, n);
    pending_ = Slot::kOther;
    if (depth_ == 1 && !inputs_seen_ && key == "inputs") {
      inputs_seen_ = true;
      pending_ = Slot::kInputs;
    } else if (in_input_ && depth_ == 3 && !datatype_seen_ && key == "datatype") {
      datatype_seen_ = true;
      pending_ = Slot::kDatatype;
    } else if (in_input_ && depth_ == 3 && !data_seen_ && key == "data") {
      data_seen_ = true;
      pending_ = Slot::kData;
    }
    return doc_.Key(s, n, copy);
  }
  bool EndObject(rapidjson::SizeType members) {
    if (writer_ != nullptr) return Forward([=](auto& h) { return h.EndObject(members); });
    if (--depth_ == 2 && in_input_) in_input_ = false;
    return doc_.EndObject(members);
  }
  bool StartArray() {
    const bool inputs = writer_ == nullptr && pending_ == Slot::kInputs;
    if (!Value([](auto& h) { return h.StartArray(); })) return false;
    if (writer_ != nullptr) return true;
    ++depth_;
    if (inputs) in_inputs_ = true;
    return true;
  }
  bool EndArray(rapidjson::SizeType elements) {
    if (writer_ != nullptr) return Forward([=](auto& h) { return h.EndArray(elements); });
    if (--depth_ == 1 && in_inputs_) in_inputs_ = false;
    return doc_.EndArray(elements);
  }

 private:
  enum class Slot { kOther, kInputs, kDatatype, kData };

  // The first event of a value outside a DataWriter: it may begin an element of "inputs", or
  // a "data" that a DataWriter takes from here on.
  template <typename Event>
  bool Value(Event event) {
    if (writer_ != nullptr) return Forward(event);
    if (in_inputs_ && depth_ == 2) ++input_;
    const Slot slot = std::exchange(pending_, Slot::kOther);
    if (slot == Slot::kData && dtype_.has_value()) {
      if (taken_.size() <= static_cast<size_t>(input_)) taken_.resize(input_ + 1);
      writer_ = &taken_[input_].emplace(*dtype_, /*stop_at_fault=*/false);
      doc_.Null();  // in the data's place, so that FindMember("data") still finds it first
      return Forward(event);
    }
    return event(doc_);
  }

  template <typename Event>
  bool Forward(Event event) {
    const bool go_on = event(*writer_);
    if (writer_->done()) writer_ = nullptr;
    return go_on;
  }

  Document& doc_;
  std::vector<std::optional<DataWriter>>& taken_;
  DataWriter* writer_ = nullptr;  // the DataWriter that takes the events, while one does
  int depth_ = 0;                 // containers open outside DataWriters
  Slot pending_ = Slot::kOther;   // what the value after the last key is
  bool inputs_seen_ = false;
  bool in_inputs_ = false;  // inside the root's first "inputs" array
  int input_ = -1;          // the element of "inputs" last begun
  bool in_input_ = false;   // inside an object that is an element of "inputs"
  bool datatype_seen_ = false, data_seen_ = false;
  std::optional<DType> dtype_;  // the input's first "datatype", where it names one of ours
};

}  // namespace

absl::Status ParseInferJson(std::string_view header, Document* doc,
                            std::vector<std::optional<DataWriter>>* taken) {
  // The stream Document::Parse(text, length) reads through: it skips a byte order mark as
  // that does, and error offsets count from the same byte.
  rapidjson::MemoryStream memory(header.data(), header.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(memory);
  rapidjson::Reader reader;
  rapidjson::ParseResult result;
  Splitter splitter(*doc, *taken);
  auto parse = [&](Document&) {
    result = reader.Parse<kJsonParseFlags>(in, splitter);
    return !result.IsError();
  };
  doc->Populate(parse);
  return CheckParsed(result, "infer request", *doc);
}

absl::Status EncodeData(const rapidjson::Value& v, DType dtype, const std::string& what,
                        std::string* out) {
  DataWriter writer(dtype, /*stop_at_fault=*/true);
  v.Accept(writer);
  return writer.Finish(what, out);
}

}  // namespace opserve::http
