// matmul on the CPU: C = A x B with float32 accumulation (BFLOAT16 inputs widened first),
// i-k-j order so the inner loop streams rows of B and C, rows split across hardware threads.
#include <algorithm>
#include <thread>
#include <vector>

#include "server/cpu/reference.h"

namespace opserve::cpu {
namespace {

// Below this much work a thread costs more than it saves.
constexpr uint64_t kFlopsPerThread = 1 << 24;

template <typename T>
float Load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return Bf16ToFloat(p[i]);
  } else {
    return p[i];
  }
}

template <typename T>
void MatmulRows(const T* a, const T* b, float* c, int64_t row_begin, int64_t row_end, int64_t n,
                int64_t k) {
  std::vector<float> b_row(static_cast<size_t>(n));
  for (int64_t i = row_begin; i < row_end; ++i) {
    float* c_row = c + i * n;
    std::fill(c_row, c_row + n, 0.f);
    for (int64_t p = 0; p < k; ++p) {
      const float a_ip = Load(a, i * k + p);
      const T* b_p = b + p * n;
      for (int64_t j = 0; j < n; ++j) c_row[j] += a_ip * Load(b_p, j);
    }
  }
}

template <typename T>
void Matmul(const T* a, const T* b, float* c, int64_t m, int64_t n, int64_t k) {
  const uint64_t flops = 2ull * m * n * k;
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads =
      std::clamp<int64_t>(static_cast<int64_t>(flops / kFlopsPerThread), 1, std::min(hw, m));
  if (threads == 1) {
    MatmulRows(a, b, c, 0, m, n, k);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (m + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * per, end = std::min(m, begin + per);
    if (begin < end) pool.emplace_back(MatmulRows<T>, a, b, c, begin, end, n, k);
  }
  for (auto& th : pool) th.join();
}

}  // namespace

absl::Status MatmulReference(const KernelArgs& args) {
  const int64_t m = args.input_meta[0].shape[0], k = args.input_meta[0].shape[1];
  const int64_t n = args.input_meta[1].shape[1];
  auto* c = static_cast<float*>(args.output);
  if (args.input_meta[0].dtype == DType::kBFloat16) {
    Matmul(static_cast<const uint16_t*>(args.inputs[0]),
           static_cast<const uint16_t*>(args.inputs[1]), c, m, n, k);
  } else {
    Matmul(static_cast<const float*>(args.inputs[0]), static_cast<const float*>(args.inputs[1]),
           c, m, n, k);
  }
  return absl::OkStatus();
}

}  // namespace opserve::cpu
