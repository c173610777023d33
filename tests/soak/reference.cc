#include "tests/soak/reference.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace opserve::soak {
namespace {

// float32's unit roundoff.
constexpr double kU = 0x1p-24;
// The server's pairwise float32 sum adds up to this many elements in a plain loop before it
// splits (server/cpu/ref_sum.cc); the error bound of that loop grows with it.
constexpr double kSumBlock = 128;

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// Round to nearest even, as a float32 -> bfloat16 conversion does.
uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
T Load(const std::string& data, uint64_t i) {
  T v;
  std::memcpy(&v, data.data() + i * sizeof(T), sizeof(T));
  return v;
}

double ElementAt(const client::HostTensor& t, uint64_t i) {
  switch (t.dtype) {
    case v1::FLOAT32:
      return Load<float>(t.data, i);
    case v1::BFLOAT16:
      return Bf16ToFloat(Load<uint16_t>(t.data, i));
    case v1::INT32:
      return Load<int32_t>(t.data, i);
    case v1::INT64:
      return static_cast<double>(Load<int64_t>(t.data, i));
    default:
      return std::nan("");
  }
}

uint64_t Count(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::Status NeedExact(const RefTensor& t, absl::string_view op) {
  if (t.Exact()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the test sends ", op, " exact inputs only"));
}

RefTensor Sum(const RefTensor& x) {
  RefTensor out;
  out.dtype = x.dtype == v1::INT32 ? v1::INT64 : v1::FLOAT32;
  double sum = 0, magnitude = 0;
  for (double v : x.values) {
    sum += v;
    magnitude += std::fabs(v);
  }
  // Pairwise float32: a plain loop of up to kSumBlock elements, then log2(n / block) levels.
  const double levels = std::ceil(std::log2(std::max<double>(1, x.values.size() / kSumBlock)));
  out.values = {sum};
  out.tolerance = {x.dtype == v1::INT32 ? 0 : (kSumBlock + levels + 2) * kU * magnitude};
  return out;
}

RefTensor RowReduce(const RefTensor& x, bool mean) {
  const int64_t rows = x.shape[0], cols = x.shape[1];
  RefTensor out;
  out.dtype = v1::FLOAT32;
  out.shape = {rows};
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0, magnitude = 0;
    for (int64_t c = 0; c < cols; ++c) {
      sum += x.values[r * cols + c];
      magnitude += std::fabs(x.values[r * cols + c]);
    }
    const double scale = mean ? 1.0 / static_cast<double>(cols) : 1.0;
    // float64 accumulation (its error is ~1e-16 relative), then one rounding to float32.
    out.values.push_back(sum * scale);
    out.tolerance.push_back(2 * kU * magnitude * scale);
  }
  return out;
}

RefTensor Transpose(const RefTensor& x) {
  const int64_t rows = x.shape[0], cols = x.shape[1];
  RefTensor out;
  out.dtype = x.dtype;
  out.shape = {cols, rows};
  out.values.resize(x.values.size());
  out.tolerance.resize(x.values.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out.values[c * rows + r] = x.values[r * cols + c];
      out.tolerance[c * rows + r] = x.tolerance[r * cols + c];
    }
  }
  return out;
}

RefTensor Matmul(const RefTensor& a, const RefTensor& b) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
  RefTensor out;
  out.dtype = v1::FLOAT32;
  out.shape = {m, n};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = a.values[i * k + p] * b.values[p * n + j];
        sum += term;
        magnitude += std::fabs(term);
      }
      // float32 accumulation over k terms: each product and each add rounds once.
      out.values.push_back(sum);
      out.tolerance.push_back((static_cast<double>(k) + 2) * kU * magnitude);
    }
  }
  return out;
}

}  // namespace

bool RefTensor::Exact() const {
  for (double t : tolerance) {
    if (t != 0) return false;
  }
  return true;
}

uint64_t RefTensor::Bytes() const { return values.size() * client::DTypeSize(dtype); }

client::HostTensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                std::mt19937_64& rng) {
  client::HostTensor t;
  t.dtype = dtype;
  t.shape = shape;
  const uint64_t n = Count(shape);
  t.data.resize(n * client::DTypeSize(dtype));
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int32_t> int32(-1000, 1000);
  std::uniform_int_distribution<int64_t> int64(-(int64_t{1} << 40), int64_t{1} << 40);
  char* out = t.data.data();
  for (uint64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case v1::FLOAT32: {
        const float v = real(rng);
        std::memcpy(out + 4 * i, &v, 4);
        break;
      }
      case v1::BFLOAT16: {
        const uint16_t v = FloatToBf16(real(rng));
        std::memcpy(out + 2 * i, &v, 2);
        break;
      }
      case v1::INT32: {
        const int32_t v = int32(rng);
        std::memcpy(out + 4 * i, &v, 4);
        break;
      }
      case v1::INT64: {
        const int64_t v = int64(rng);
        std::memcpy(out + 8 * i, &v, 8);
        break;
      }
      default:
        break;
    }
  }
  return t;
}

RefTensor FromHost(const client::HostTensor& tensor) {
  RefTensor t;
  t.dtype = tensor.dtype;
  t.shape = tensor.shape;
  const uint64_t size = client::DTypeSize(tensor.dtype);
  const uint64_t n = size ? tensor.data.size() / size : 0;
  t.values.reserve(n);
  for (uint64_t i = 0; i < n; ++i) t.values.push_back(ElementAt(tensor, i));
  t.tolerance.assign(n, 0.0);
  return t;
}

absl::StatusOr<RefTensor> Reference(absl::string_view op,
                                    const std::vector<const RefTensor*>& inputs) {
  if (op == "transpose") return Transpose(*inputs[0]);
  for (const RefTensor* t : inputs) {
    if (absl::Status s = NeedExact(*t, op); !s.ok()) return s;
  }
  if (op == "sum") return Sum(*inputs[0]);
  if (op == "row_sum") return RowReduce(*inputs[0], /*mean=*/false);
  if (op == "row_mean") return RowReduce(*inputs[0], /*mean=*/true);
  if (op == "matmul") return Matmul(*inputs[0], *inputs[1]);
  return absl::InvalidArgumentError(absl::StrCat("no reference for op '", op, "'"));
}

absl::Status Compare(const RefTensor& expected, const client::HostTensor& got) {
  if (got.dtype != expected.dtype || got.shape != expected.shape) {
    return absl::DataLossError(absl::StrCat(
        "expected ", client::DTypeName(expected.dtype), client::ShapeString(expected.shape),
        ", got ", client::DTypeName(got.dtype), client::ShapeString(got.shape)));
  }
  if (got.data.size() != expected.Bytes()) {
    return absl::DataLossError(
        absl::StrCat("expected ", expected.Bytes(), " bytes, got ", got.data.size()));
  }
  for (uint64_t i = 0; i < expected.values.size(); ++i) {
    const double value = ElementAt(got, i);
    // Written so that NaN fails: every comparison with NaN is false.
    if (!(std::fabs(value - expected.values[i]) <= expected.tolerance[i])) {
      return absl::DataLossError(absl::StrFormat("element %d is %.9g, expected %.9g +- %.3g", i,
                                                 value, expected.values[i], expected.tolerance[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace opserve::soak
