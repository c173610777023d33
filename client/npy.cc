#include "client/npy.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"  // header only: the macros, no link to opserve_core

namespace opserve::client {
namespace {

// The element bytes are copied as they are: the file, the wire and the host all hold them
// little-endian.
static_assert(std::endian::native == std::endian::little, "opserve assumes a little-endian host");

constexpr absl::string_view kMagic("\x93NUMPY", 6);
constexpr uint64_t kPreambleV1 = 10;   // magic, 2 version bytes, uint16 header length
constexpr uint64_t kPreambleV2 = 12;   // magic, 2 version bytes, uint32 header length
constexpr uint64_t kHeaderAlign = 64;  // NumPy pads so the data starts 64-byte aligned

struct DTypeCode {
  v1::DType dtype;
  absl::string_view descr;
};
constexpr DTypeCode kDTypeCodes[] = {
    {v1::FLOAT32, "<f4"},
    {v1::INT32, "<i4"},
    {v1::INT64, "<i8"},
};
constexpr absl::string_view kExpectedDescrs = "'<f4', '<i4' or '<i8'";

absl::Status Invalid(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// A character for an error message: printable as itself, anything else as an escape.
std::string Shown(absl::string_view text, size_t pos) {
  if (pos >= text.size()) return "the end of the header";
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  return absl::StrFormat("byte 0x%02x", c);
}

// Parses the header's Python dict literal. Only the subset NumPy writes is accepted: string
// keys, a string 'descr', a bool 'fortran_order' and a tuple of non-negative ints 'shape'.
class HeaderParser {
 public:
  HeaderParser(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}

  absl::Status Parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      ASSIGN_OR_RETURN(std::string key, ParseString("a quoted key"));
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after '", key, "'"));
      SkipSpace();
      bool* seen = nullptr;
      if (key == "descr") {
        seen = &have_descr;
        ASSIGN_OR_RETURN(*descr, ParseString("a quoted dtype string such as '<f4'"));
      } else if (key == "fortran_order") {
        seen = &have_fortran;
        ASSIGN_OR_RETURN(*fortran_order, ParseBool());
      } else if (key == "shape") {
        seen = &have_shape;
        ASSIGN_OR_RETURN(*shape, ParseShape());
      } else {
        return Error(absl::StrCat("unexpected key '", key,
                                  "' (expected 'descr', 'fortran_order' and 'shape')"));
      }
      // The flag is checked after the value so the message can name the repeated key.
      if (*seen) return Error(absl::StrCat("key '", key, "' appears twice"));
      *seen = true;
      SkipSpace();
      if (Consume('}')) break;
      if (!Consume(',')) return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("expected only padding after '}'");
    if (!have_descr) return Error("the header has no 'descr'");
    if (!have_fortran) return Error("the header has no 'fortran_order'");
    if (!have_shape) return Error("the header has no 'shape'");
    return absl::OkStatus();
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool IsDigit() const { return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; }

  absl::Status Error(absl::string_view what) const {
    return Invalid(source_, absl::StrCat("bad .npy header: ", what, " at header byte ", pos_,
                                         ", found ", Shown(text_, pos_)));
  }

  absl::StatusOr<std::string> ParseString(absl::string_view expected) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error(absl::StrCat("expected ", expected));
    }
    const char quote = text_[pos_++];
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      // Escapes never occur in the keys and dtype codes NumPy writes: refuse them rather than
      // decode them.
      if (text_[pos_] == '\\') return Error("escapes in strings are not supported");
      ++pos_;
    }
    if (pos_ >= text_.size()) return Error("unterminated string");
    std::string value(text_.substr(start, pos_ - start));
    ++pos_;
    return value;
  }

  absl::StatusOr<bool> ParseBool() {
    if (absl::StartsWith(text_.substr(pos_), "True")) {
      pos_ += 4;
      return true;
    }
    if (absl::StartsWith(text_.substr(pos_), "False")) {
      pos_ += 5;
      return false;
    }
    return Error("expected True or False for 'fortran_order'");
  }

  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    std::vector<int64_t> shape;
    if (!Consume('(')) return Error("expected a tuple such as (2, 3) for 'shape'");
    while (true) {
      SkipSpace();
      if (Consume(')')) return shape;
      if (shape.size() == static_cast<size_t>(kNpyMaxRank)) {
        return Error(absl::StrCat("shape has more than ", kNpyMaxRank, " dimensions"));
      }
      if (pos_ < text_.size() && text_[pos_] == '-') return Error("negative dimension");
      if (!IsDigit()) return Error("expected a dimension (a non-negative integer)");
      int64_t dim = 0;
      while (IsDigit()) {
        const int64_t digit = text_[pos_] - '0';
        if (dim > (std::numeric_limits<int64_t>::max() - digit) / 10) {
          return Error("dimension exceeds 2^63-1");
        }
        dim = dim * 10 + digit;
        ++pos_;
      }
      Consume('L');  // Python 2 NumPy wrote long ints as 3L
      shape.push_back(dim);
      SkipSpace();
      if (Consume(')')) return shape;
      if (!Consume(',')) return Error("expected ',' or ')' in 'shape'");
    }
  }

  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
};

uint32_t ReadLittleEndian(absl::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

absl::StatusOr<v1::DType> DTypeFromDescr(const std::string& descr, absl::string_view source) {
  for (const DTypeCode& code : kDTypeCodes) {
    if (descr == code.descr) return code.dtype;
  }
  if (!descr.empty() && descr[0] == '>') {
    return Invalid(source, absl::StrCat("big-endian dtype '", descr,
                                        "' is not supported (expected ", kExpectedDescrs, ")"));
  }
  return Invalid(source,
                 absl::StrCat("unsupported dtype '", descr, "' (expected ", kExpectedDescrs, ")"));
}

absl::StatusOr<absl::string_view> DescrFor(v1::DType dtype) {
  for (const DTypeCode& code : kDTypeCodes) {
    if (dtype == code.dtype) return code.descr;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(".npy files hold float32, int32 or int64 here, not ", DTypeName(dtype)));
}

absl::Status ErrnoError(const std::string& path, absl::string_view action) {
  const int err = errno;
  std::string message = absl::StrCat(path, ": cannot ", action, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

}  // namespace

absl::StatusOr<NpyLayout> ParseNpyHeader(absl::string_view prefix, uint64_t file_size,
                                         absl::string_view source) {
  if (prefix.size() > file_size) {
    return absl::InternalError(absl::StrCat(source, ": prefix longer than the file"));
  }
  if (file_size < kMagic.size() || prefix.substr(0, kMagic.size()) != kMagic) {
    return Invalid(source, "not a .npy file (it does not start with \"\\x93NUMPY\")");
  }
  if (file_size < kPreambleV1 || prefix.size() < kPreambleV1) {
    return Invalid(
        source, absl::StrCat("truncated: ", file_size, " bytes is too short for a .npy preamble"));
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  const int minor = static_cast<unsigned char>(prefix[7]);
  uint64_t preamble = 0;
  if (major == 1 && minor == 0) {
    preamble = kPreambleV1;
  } else if (major == 2 && minor == 0) {
    preamble = kPreambleV2;
  } else {
    return Invalid(source, absl::StrCat("unsupported .npy version ", major, ".", minor,
                                        " (expected 1.0 or 2.0)"));
  }
  if (prefix.size() < preamble) {
    return Invalid(
        source, absl::StrCat("truncated: ", file_size, " bytes is too short for a version ", major,
                             ".0 preamble"));
  }
  const uint64_t header_bytes = ReadLittleEndian(prefix.substr(8, preamble - 8));
  if (header_bytes > kNpyMaxHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_bytes, " exceeds the limit of ",
                                        kNpyMaxHeaderBytes, " bytes"));
  }
  if (header_bytes > file_size - preamble) {
    return Invalid(source,
                   absl::StrCat("header length ", header_bytes, " runs past the end of the file (",
                                file_size - preamble, " bytes follow the preamble)"));
  }
  if (prefix.size() < preamble + header_bytes) {
    return absl::InternalError(absl::StrCat(source, ": the prefix does not hold the header"));
  }
  const absl::string_view header = prefix.substr(preamble, header_bytes);

  std::string descr;
  bool fortran_order = false;
  NpyLayout layout;
  RETURN_IF_ERROR(HeaderParser(header, source).Parse(&descr, &fortran_order, &layout.shape));
  ASSIGN_OR_RETURN(layout.dtype, DTypeFromDescr(descr, source));
  if (fortran_order) {
    return Invalid(source,
                   "fortran_order True is not supported (expected C order: save "
                   "np.ascontiguousarray(x))");
  }
  absl::StatusOr<uint64_t> data_bytes = ByteSize(layout.dtype, layout.shape);
  if (!data_bytes.ok()) return Invalid(source, data_bytes.status().message());
  layout.data_offset = preamble + header_bytes;
  layout.data_bytes = *data_bytes;
  const uint64_t present = file_size - layout.data_offset;
  if (present < layout.data_bytes) {
    return Invalid(source, absl::StrCat("truncated data: ", DTypeName(layout.dtype),
                                        ShapeString(layout.shape), " needs ", layout.data_bytes,
                                        " bytes, the file has ", present, " after the header"));
  }
  if (present > layout.data_bytes) {
    return Invalid(source,
                   absl::StrCat(present - layout.data_bytes, " unexpected bytes after the data of ",
                                DTypeName(layout.dtype), ShapeString(layout.shape), " (",
                                layout.data_bytes, " bytes)"));
  }
  return layout;
}

absl::StatusOr<HostTensor> ParseNpy(absl::string_view bytes, absl::string_view source) {
  ASSIGN_OR_RETURN(NpyLayout layout, ParseNpyHeader(bytes, bytes.size(), source));
  HostTensor tensor;
  tensor.dtype = layout.dtype;
  tensor.shape = std::move(layout.shape);
  // Checked by ParseNpyHeader: the data exactly fills the rest of `bytes`.
  tensor.data.assign(bytes.data() + layout.data_offset, layout.data_bytes);
  return tensor;
}

absl::StatusOr<HostTensor> ReadNpyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(path, "open");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) return ErrnoError(path, "seek");
  const uint64_t file_size = static_cast<uint64_t>(end);
  in.seekg(0);

  // The header is bounded, so this prefix holds all of it in any file that can be valid.
  std::string prefix(std::min<uint64_t>(file_size, kPreambleV2 + kNpyMaxHeaderBytes), '\0');
  if (!in.read(prefix.data(), static_cast<std::streamsize>(prefix.size()))) {
    return ErrnoError(path, "read");
  }
  ASSIGN_OR_RETURN(NpyLayout layout, ParseNpyHeader(prefix, file_size, path));

  HostTensor tensor;
  tensor.dtype = layout.dtype;
  tensor.shape = std::move(layout.shape);
  // Allocation is bounded by the file's real size, checked above, but may still exceed memory.
  try {
    tensor.data.resize(layout.data_bytes);
  } catch (const std::exception&) {  // std::bad_alloc, std::length_error
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot allocate ", layout.data_bytes, " bytes for the data"));
  }
  in.seekg(static_cast<std::streamoff>(layout.data_offset));
  if (!in.read(tensor.data.data(), static_cast<std::streamsize>(tensor.data.size()))) {
    // Only a file that shrank since it was measured gets here.
    return Invalid(path, absl::StrCat("truncated data: read ", in.gcount(), " of ",
                                      layout.data_bytes, " bytes"));
  }
  return tensor;
}

absl::StatusOr<std::string> NpyHeader(v1::DType dtype, const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(absl::string_view descr, DescrFor(dtype));
  RETURN_IF_ERROR(ByteSize(dtype, shape).status());
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&dims, i ? ", " : "", shape[i]);
  if (shape.size() == 1) dims += ",";  // a Python 1-tuple: (5,)
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");

  // Spaces then '\n' pad the header so the data starts on a 64-byte boundary, as NumPy does.
  uint64_t preamble = kPreambleV1;
  uint64_t total = (preamble + dict.size() + 1 + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
  if (total - preamble > std::numeric_limits<uint16_t>::max()) {
    preamble = kPreambleV2;
    total = (preamble + dict.size() + 1 + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
  }
  const uint64_t header_bytes = total - preamble;
  std::string out(kMagic);
  out += static_cast<char>(preamble == kPreambleV1 ? 1 : 2);
  out += '\0';
  for (uint64_t i = 0; i < preamble - 8; ++i)
    out += static_cast<char>((header_bytes >> (8 * i)) & 0xff);
  out += dict;
  out.append(total - out.size() - 1, ' ');
  out += '\n';
  return out;
}

absl::StatusOr<std::string> SerializeNpy(const HostTensor& tensor) {
  ASSIGN_OR_RETURN(std::string out, NpyHeader(tensor.dtype, tensor.shape));
  ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(tensor.dtype, tensor.shape));
  if (bytes != tensor.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(DTypeName(tensor.dtype), ShapeString(tensor.shape), " needs ", bytes,
                     " bytes, the tensor holds ", tensor.data.size()));
  }
  out += tensor.data;
  return out;
}

absl::Status WriteNpyFile(const std::string& path, const HostTensor& tensor) {
  absl::StatusOr<std::string> header = NpyHeader(tensor.dtype, tensor.shape);
  if (!header.ok()) return Invalid(path, header.status().message());
  ASSIGN_OR_RETURN(uint64_t bytes, ByteSize(tensor.dtype, tensor.shape));
  if (bytes != tensor.data.size()) {
    return Invalid(path, absl::StrCat(DTypeName(tensor.dtype), ShapeString(tensor.shape), " needs ",
                                      bytes, " bytes, the tensor holds ", tensor.data.size()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoError(path, "create");
  // Header and data are written separately so a multi-GiB tensor is never copied.
  out.write(header->data(), static_cast<std::streamsize>(header->size()));
  out.write(tensor.data.data(), static_cast<std::streamsize>(tensor.data.size()));
  out.close();
  if (!out) return ErrnoError(path, "write");
  return absl::OkStatus();
}

}  // namespace opserve::client
