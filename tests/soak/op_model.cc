#include "tests/soak/op_model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op_util.h"
#include "tests/support/result_check.h"

namespace opserve::soak {
namespace {

// common/dtype.h keeps DType's values equal to the proto's.
v1::DType ToProto(DType d) { return static_cast<v1::DType>(static_cast<int>(d)); }
DType FromProto(v1::DType d) { return static_cast<DType>(static_cast<int>(d)); }

// A size within a factor of two of `size`: the case's scale, so the soak stays cheap, but
// not always its exact size.
int64_t Near(int64_t size, std::mt19937_64& rng) {
  const int64_t low = std::max<int64_t>(1, (size + 1) / 2), high = std::max<int64_t>(1, 2 * size);
  return low + static_cast<int64_t>(rng() % static_cast<uint64_t>(high - low + 1));
}

// `c` with its sizes replaced through `sizes` (sizes not yet there drawn near themselves), or
// nullopt where `input0` contradicts the case (two equal sizes of its input 0 fixed to differ).
std::optional<Shapes> Fit(const Shapes& c, const std::vector<int64_t>* input0,
                          std::mt19937_64& rng) {
  std::map<int64_t, int64_t> sizes;
  if (input0 != nullptr) {
    if (c.empty() || c[0].size() != input0->size()) return std::nullopt;
    for (size_t i = 0; i < input0->size(); ++i) {
      const auto [it, fresh] = sizes.emplace(c[0][i], (*input0)[i]);
      if (!fresh && it->second != (*input0)[i]) return std::nullopt;
    }
  }
  Shapes out = c;
  for (std::vector<int64_t>& shape : out) {
    for (int64_t& d : shape) {
      auto it = sizes.find(d);
      if (it == sizes.end()) it = sizes.emplace(d, Near(d, rng)).first;
      d = it->second;
    }
  }
  return out;
}

std::vector<const void*> Pointers(const std::vector<client::HostTensor>& tensors) {
  std::vector<const void*> out;
  for (const client::HostTensor& t : tensors) out.push_back(t.data.data());
  return out;
}

std::vector<TensorMeta> Metas(const std::vector<client::HostTensor>& tensors) {
  std::vector<TensorMeta> out;
  for (const client::HostTensor& t : tensors) out.push_back({FromProto(t.dtype), t.shape});
  return out;
}

}  // namespace

bool SoakOp::Runs(v1::DType dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

Backend& CpuDevice() {
  static Backend* const backend = MakeCpuBackend(0).release();
  return *backend;
}

std::span<const SoakOp> SoakOps() {
  static const std::vector<SoakOp>* const ops = [] {
    auto* out = new std::vector<SoakOp>;
    for (const OpSpec& op : Ops()) {
      SoakOp s{.spec = &op, .dtypes = {}};
      for (DType d : DTypesFor(op.name, CpuDevice())) s.dtypes.push_back(ToProto(d));
      if (!s.dtypes.empty()) out->push_back(std::move(s));
    }
    return out;
  }();
  return *ops;
}

std::optional<Shapes> DrawShapes(const OpSpec& op, v1::DType dtype,
                                 const std::vector<int64_t>* input0, std::mt19937_64& rng) {
  const auto& cases = op.test.small_shapes;
  std::vector<size_t> order(cases.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i : order) {
    std::optional<Shapes> shapes = Fit(cases[i], input0, rng);
    if (!shapes || static_cast<int>(shapes->size()) != op.arity) continue;
    std::vector<TensorMeta> metas;
    for (const std::vector<int64_t>& s : *shapes) metas.push_back({FromProto(dtype), s});
    if (op.infer(metas).ok()) return shapes;
  }
  return std::nullopt;
}

client::HostTensor RandomTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                std::mt19937_64& rng) {
  client::HostTensor t{.dtype = dtype, .shape = shape, .data = {}};
  const TensorMeta meta{FromProto(dtype), shape};
  const int64_t n = meta.NumElements();
  t.data.resize(meta.Bytes());
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int32_t> int32(-1000, 1000);
  std::uniform_int_distribution<int64_t> int64(-(int64_t{1} << 40), int64_t{1} << 40);
  char* out = t.data.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (meta.dtype) {
      case DType::kFloat32: {
        const float v = real(rng);
        std::memcpy(out + 4 * i, &v, 4);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t v = op_util::FloatToBf16(real(rng));
        std::memcpy(out + 2 * i, &v, 2);
        break;
      }
      case DType::kInt32: {
        const int32_t v = int32(rng);
        std::memcpy(out + 4 * i, &v, 4);
        break;
      }
      case DType::kInt64: {
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

TensorMeta Expected::Meta() const { return {FromProto(tensor.dtype), tensor.shape}; }

Expected Exactly(client::HostTensor tensor) { return Expected{.tensor = std::move(tensor)}; }

absl::StatusOr<Expected> Reference(const OpSpec& op, const std::vector<const Expected*>& inputs,
                                   ExecEnv& env) {
  Expected out{.op = &op};
  for (const Expected* in : inputs) out.inputs.push_back(in->tensor);
  const std::vector<TensorMeta> metas = Metas(out.inputs);
  absl::StatusOr<TensorMeta> out_meta = op.infer(metas);
  if (!out_meta.ok()) return out_meta.status();
  const AlgoSpec* reference = CpuReference(op.name);
  if (reference == nullptr) {
    return absl::InternalError(absl::StrCat("the table has no CPU reference for ", op.name));
  }
  out.tensor = {.dtype = ToProto(out_meta->dtype), .shape = out_meta->shape, .data = {}};
  out.tensor.data.resize(out_meta->Bytes());
  const std::vector<const void*> pointers = Pointers(out.inputs);
  const AttrMap attrs;
  absl::Status run = reference->run(
      KernelArgs{pointers, metas, out.tensor.data.data(), *out_meta, attrs, env});
  (void)env.Finish(0);  // frees what the row took as scratch
  if (!run.ok()) return run;
  if (out_meta->dtype != DType::kFloat32) return Exactly(std::move(out.tensor));
  return out;
}

absl::Status Compare(const Expected& expected, const client::HostTensor& got) {
  const client::HostTensor& want = expected.tensor;
  if (got.dtype != want.dtype || got.shape != want.shape) {
    return absl::DataLossError(absl::StrCat(
        "expected ", client::DTypeName(want.dtype), client::ShapeString(want.shape), ", got ",
        client::DTypeName(got.dtype), client::ShapeString(got.shape)));
  }
  if (got.data.size() != want.data.size()) {
    return absl::DataLossError(
        absl::StrCat("expected ", want.data.size(), " bytes, got ", got.data.size()));
  }
  if (expected.Exact()) {
    const uint64_t size = client::DTypeSize(want.dtype);
    for (uint64_t i = 0; i < want.data.size(); i += size) {
      if (std::memcmp(got.data.data() + i, want.data.data() + i, size) != 0) {
        return absl::DataLossError(absl::StrCat("element ", i / size, " differs"));
      }
    }
    return absl::OkStatus();
  }
  const std::vector<TensorMeta> metas = Metas(expected.inputs);
  const std::vector<const void*> pointers = Pointers(expected.inputs);
  const TensorMeta out_meta = expected.Meta();
  return CheckResult({.op = *expected.op,
                      .input_meta = metas,
                      .inputs = pointers,
                      .output_meta = out_meta,
                      .got = got.data.data(),
                      .reference = want.data.data()},
                     expected.algorithm);
}

}  // namespace opserve::soak
