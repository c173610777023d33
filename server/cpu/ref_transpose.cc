// transpose on the CPU for every dtype, in cache-sized tiles.
#include <algorithm>
#include <cstring>

#include "server/cpu/reference.h"

namespace opserve::cpu {
namespace {

// 64 x 64 elements of 8 bytes is 32 KiB per side: a tile's rows and columns stay in L1/L2.
constexpr int64_t kTile = 64;

template <typename T>
void TransposeTiled(const T* in, T* out, int64_t rows, int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

}  // namespace

absl::Status TransposeReference(const KernelArgs& args) {
  const int64_t rows = args.input_meta[0].shape[0], cols = args.input_meta[0].shape[1];
  switch (ElementSize(args.input_meta[0].dtype)) {
    case 2:
      TransposeTiled(static_cast<const uint16_t*>(args.inputs[0]),
                     static_cast<uint16_t*>(args.output), rows, cols);
      break;
    case 4:
      TransposeTiled(static_cast<const uint32_t*>(args.inputs[0]),
                     static_cast<uint32_t*>(args.output), rows, cols);
      break;
    case 8:
      TransposeTiled(static_cast<const uint64_t*>(args.inputs[0]),
                     static_cast<uint64_t*>(args.output), rows, cols);
      break;
    default:
      return absl::InternalError("transpose: unexpected element size");
  }
  return absl::OkStatus();
}

}  // namespace opserve::cpu
