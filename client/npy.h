// NumPy .npy files: read and write float32, int32 and int64 arrays in C order.
//
// Format (numpy.lib.format): the magic "\x93NUMPY", a version byte pair (1.0: 2-byte header
// length, 2.0: 4-byte), the little-endian header length, then an ASCII Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } and the raw element bytes.
//
// Readers treat the file as hostile (a fuzzer targets ParseNpy): every length and dimension is
// checked against the bytes actually present before anything is allocated, and errors name the
// source with what was expected and what was found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/host_tensor.h"

namespace opserve::client {

// Limits that keep a hostile header from asking for absurd work. NumPy itself writes headers of
// well under 1 KiB; its reader stops at 10000 bytes by default.
inline constexpr uint64_t kNpyMaxHeaderBytes = 64 * 1024;
inline constexpr int kNpyMaxRank = 32;  // NumPy 1.x's NPY_MAXDIMS

// Where a file's data lies and what it holds, from its preamble and header alone.
struct NpyLayout {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // bytes before the element data
  uint64_t data_bytes = 0;   // product(shape) * element size
};

// Parses the preamble and header in `prefix`, the first bytes of a file of `file_size` bytes
// (prefix.size() <= file_size). Checks that the data exactly fills the rest of the file.
// `source` names the file in error messages.
absl::StatusOr<NpyLayout> ParseNpyHeader(absl::string_view prefix, uint64_t file_size,
                                         absl::string_view source);

// A whole .npy image held in memory.
absl::StatusOr<HostTensor> ParseNpy(absl::string_view bytes, absl::string_view source);

// Reads `path`; the data is read straight into the tensor, without a staging copy.
absl::StatusOr<HostTensor> ReadNpyFile(const std::string& path);

// The header (preamble included, padded to 64 bytes) for `tensor`: version 1.0 where the header
// fits 65535 bytes, else 2.0.
absl::StatusOr<std::string> NpyHeader(v1::DType dtype, const std::vector<int64_t>& shape);

// A whole .npy image (header and data).
absl::StatusOr<std::string> SerializeNpy(const HostTensor& tensor);

// Writes `tensor` to `path`, replacing it.
absl::Status WriteNpyFile(const std::string& path, const HostTensor& tensor);

}  // namespace opserve::client
