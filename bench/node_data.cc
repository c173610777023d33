// The node section's upload data, drawn where it is needed (node_bench_internal.h), and the
// checks of what the servers send back against it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/node_bench_internal.h"

namespace opserve::bench::node_bench {

std::string Draw(const Gen& g, uint64_t e0, uint64_t e1, std::vector<RowPart>* sums) {
  std::string out((e1 - e0) * g.ElemBytes(), '\0');
  if (g.dtype == v1::BFLOAT16) {
    auto* p = reinterpret_cast<uint16_t*>(out.data());
    for (uint64_t i = e0; i < e1; ++i) p[i - e0] = Bf16Bits(ValueAt(g.seed, i));
    return out;
  }
  auto* p = reinterpret_cast<float*>(out.data());
  for (uint64_t i = e0; i < e1;) {
    const int64_t row = static_cast<int64_t>(i / g.cols);
    const uint64_t end = std::min<uint64_t>(e1, static_cast<uint64_t>(row + 1) * g.cols);
    double s = 0, a = 0;
    for (; i < end; ++i) {
      const float v = ValueAt(g.seed, i);
      p[i - e0] = v;
      s += v;
      a += std::fabs(v);
    }
    if (sums != nullptr) sums->push_back({row, s, a});
  }
  return out;
}

int GenThreads(int asked) {
  if (asked > 0) return asked;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 16);
}

void SpotCheck::Chunk(const Gen& g, uint64_t offset, const std::string& bytes) {
  const int es = g.ElemBytes();
  const uint64_t first = (offset + es - 1) / es, end = (offset + bytes.size()) / es;
  if (end <= first) return;
  const uint64_t n = end - first;
  auto check = [&](uint64_t k) {
    const uint64_t i = first + k;
    const char* p = bytes.data() + (i * es - offset);
    float got;
    if (es == 2) {
      uint16_t b;
      std::memcpy(&b, p, 2);
      got = Bf16Float(b);
    } else {
      std::memcpy(&got, p, 4);
    }
    ++checked;
    if (got != g.At(i)) {
      if (first_wrong < 0) first_wrong = static_cast<int64_t>(i);
      ++wrong;
    }
  };
  for (uint64_t k = 0; k < std::min<uint64_t>(16, n); ++k) check(k);
  for (uint64_t k = std::max<uint64_t>(16, n - std::min<uint64_t>(16, n)); k < n; ++k) check(k);
  for (uint64_t s = 0; s < 16 && n > 32; ++s) check(16 + Mix(offset + s) % (n - 32));
}

std::string CheckRowMeans(const std::string& data, const std::vector<double>& sum,
                          const std::vector<double>& abs, int64_t cols) {
  if (data.size() != sum.size() * sizeof(float)) {
    return absl::StrCat("row_mean returned ", data.size(), " bytes, want ", sum.size() * 4);
  }
  const auto* got = reinterpret_cast<const float*>(data.data());
  int64_t wrong = 0, first = -1;
  for (size_t r = 0; r < sum.size(); ++r) {
    const double want = sum[r] / cols;
    // FP32 accumulation over a row in any order stays far inside this; a wrong or missing row
    // misses it by orders of magnitude.
    if (!(std::fabs(got[r] - want) <= 1e-5 * abs[r] / cols + 1e-7)) {
      if (first < 0) first = static_cast<int64_t>(r);
      ++wrong;
    }
  }
  if (wrong == 0) return "";
  return absl::StrFormat("%d of %d row means wrong, first row %d: %.7g, want %.7g", wrong,
                         sum.size(), first, got[first], sum[first] / cols);
}

}  // namespace opserve::bench::node_bench
