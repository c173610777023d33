// Fuzz target: the CLI's .npy reader.
//
// Bytes are a whole .npy image. Checks, beyond "no crash, leak or hang":
//   - ParseNpy and ParseNpyHeader over the bounded prefix ReadNpyFile reads agree: both accept
//     with the same layout, or both refuse with INVALID_ARGUMENT (a file is never INTERNAL);
//   - an accepted tensor holds exactly product(shape) * element size bytes, the file's tail;
//   - it survives SerializeNpy -> ParseNpy unchanged (dtype, shape, bytes).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/host_tensor.h"
#include "client/npy.h"
#include "tests/fuzz/fuzz_check.h"

namespace {
const absl::StatusCode kRefusals[] = {absl::StatusCode::kInvalidArgument};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserve::client;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<HostTensor> tensor = ParseNpy(bytes, "fuzz.npy");
  // What ReadNpyFile does: parse the header from a bounded prefix, knowing the file's size.
  const absl::string_view prefix = bytes.substr(0, 12 + kNpyMaxHeaderBytes);
  absl::StatusOr<NpyLayout> layout = ParseNpyHeader(prefix, size, "fuzz.npy");

  FUZZ_CHECK(tensor.ok() == layout.ok(),
             absl::StrCat("ParseNpy: ", tensor.status().ToString(),
                          "; ParseNpyHeader: ", layout.status().ToString()));
  if (!tensor.ok()) {
    FUZZ_CHECK(opserve::fuzz::ErrorIsOneOf(tensor.status(), kRefusals), tensor.status().ToString());
    FUZZ_CHECK(opserve::fuzz::ErrorIsOneOf(layout.status(), kRefusals), layout.status().ToString());
    return 0;
  }

  FUZZ_CHECK(tensor->dtype == layout->dtype && tensor->shape == layout->shape, "layouts differ");
  absl::StatusOr<uint64_t> expected = ByteSize(tensor->dtype, tensor->shape);
  FUZZ_CHECK(expected.ok() && *expected == tensor->data.size() && *expected == layout->data_bytes,
             absl::StrCat(tensor->data.size(), " bytes for ", ShapeString(tensor->shape)));
  FUZZ_CHECK(layout->data_offset + layout->data_bytes == size,
             absl::StrCat("offset ", layout->data_offset, " + ", layout->data_bytes, " != ", size));
  FUZZ_CHECK(bytes.substr(layout->data_offset) == tensor->data, "data is not the file's tail");

  absl::StatusOr<std::string> again = SerializeNpy(*tensor);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  absl::StatusOr<HostTensor> round = ParseNpy(*again, "round-trip");
  FUZZ_CHECK(round.ok(), round.status().ToString());
  FUZZ_CHECK(round->dtype == tensor->dtype && round->shape == tensor->shape &&
                 round->data == tensor->data,
             "SerializeNpy -> ParseNpy changed the tensor");
  return 0;
}
