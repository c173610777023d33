#include "tests/support/fusion_cases.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "server/ops/op_util.h"
#include "tests/support/request_builders.h"

namespace opserve::test_support {

std::string FusionCase::Name() const {
  std::vector<std::string> dims;
  for (const auto& s : shapes) dims.push_back(absl::StrJoin(s, "x"));
  return absl::StrReplaceAll(absl::StrCat(rule->name, "_", DTypeName(dtype), "_", absl::StrJoin(dims, "_")),
                             {{":", "_"}});
}

std::vector<FusionCase> FusionCases(bool large) {
  std::vector<FusionCase> out;
  for (const FusionRule& rule : FusionRules()) {
    const OpSpec* inner = FindOp(rule.inner);
    auto add = [&](const std::vector<std::vector<std::vector<int64_t>>>& cases) {
      for (const auto& shapes : cases) {
        for (DType d : inner->dtypes) out.push_back({&rule, d, shapes});
      }
    };
    add(rule.test.shapes);
    if (large) add(rule.test.large_shapes);
  }
  return out;
}

bool FusesOn(const FusionCase& c, absl::string_view backend) {
  if (c.rule->kernels.empty()) return true;
  for (const AlgoSpec& a : c.rule->kernels) {
    if (a.backend != backend) continue;
    for (DType d : a.dtypes) {
      if (d == c.dtype) return true;
    }
  }
  return false;
}

std::vector<FusionCase> RandomFusionCases(std::mt19937_64& rng, int per_rule) {
  std::vector<FusionCase> out;
  for (const FusionRule& rule : FusionRules()) {
    const OpSpec* inner = FindOp(rule.inner);
    for (int k = 0; k < per_rule; ++k) {
      const DType d = inner->dtypes[rng() % inner->dtypes.size()];
      if (inner->arity == 2) {  // matmul: [M, K] x [K, N]
        std::uniform_int_distribution<int64_t> side(1, 700);
        const int64_t m = side(rng), kk = side(rng), n = side(rng);
        out.push_back({&rule, d, {{m, kk}, {kk, n}}});
      } else {
        std::uniform_int_distribution<int64_t> side(1, 2500);
        out.push_back({&rule, d, {{side(rng), side(rng)}}});
      }
    }
  }
  return out;
}

v1::ExecuteRequest FusionRequest(const FusionCase& c, const std::vector<std::string>& inputs,
                                 bool fuse) {
  v1::ExecuteRequest req;
  std::vector<In> in;
  for (size_t k = 0; k < c.shapes.size(); ++k) {
    const std::string name = absl::StrCat("x", k);
    client::HostTensor t{static_cast<v1::DType>(c.dtype), c.shapes[k], inputs[k]};
    AddInline(req, name, t);
    in.push_back(Inline(name));
  }
  v1::Node* inner = AddNode(req, "inner", std::string(c.rule->inner), in, "auto");
  v1::Node* outer = AddNode(req, "outer", std::string(c.rule->outer), {Node("inner")}, "auto");
  if (!fuse) {
    (*inner->mutable_attrs())["fuse"].set_b(false);
    (*outer->mutable_attrs())["fuse"].set_b(false);
  }
  AddOutput(req, "outer", true);
  return req;
}

std::vector<std::string> FusionInputs(const FusionCase& c, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::uniform_int_distribution<int64_t> ints(-1000, 1000);
  std::vector<std::string> out;
  for (const auto& shape : c.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string bytes(n * ElementSize(c.dtype), '\0');
    for (int64_t i = 0; i < n; ++i) {
      switch (c.dtype) {
        case DType::kFloat32: {
          const float v = unit(rng);
          std::memcpy(&bytes[i * 4], &v, 4);
          break;
        }
        case DType::kBFloat16: {
          const uint16_t v = op_util::FloatToBf16(unit(rng));
          std::memcpy(&bytes[i * 2], &v, 2);
          break;
        }
        case DType::kInt32: {
          const auto v = static_cast<int32_t>(ints(rng));
          std::memcpy(&bytes[i * 4], &v, 4);
          break;
        }
        default: {
          const int64_t v = ints(rng);
          std::memcpy(&bytes[i * 8], &v, 8);
          break;
        }
      }
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

absl::Status CompareFusion(const FusionCase& c, DType out_dtype, const std::string& got,
                           const std::string& want, bool bitwise) {
  if (got.size() != want.size()) {
    return absl::InternalError(absl::StrCat("fused output has ", got.size(), " bytes, unfused ",
                                            want.size()));
  }
  if (out_dtype != DType::kFloat32 || bitwise) {
    if (got == want) return absl::OkStatus();
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        return absl::InternalError(absl::StrCat("fused and unfused outputs differ at byte ", i,
                                                " (element ", i / ElementSize(out_dtype), ")"));
      }
    }
  }
  const size_t n = got.size() / 4;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    float g, w;
    std::memcpy(&g, &got[i * 4], 4);
    std::memcpy(&w, &want[i * 4], 4);
    if (std::isnan(g) || std::isnan(w)) {
      return absl::InternalError(absl::StrCat("NaN at element ", i, ": fused ", g, ", unfused ", w));
    }
    diff += (double{g} - w) * (double{g} - w);
    norm += double{w} * w;
  }
  const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  if (rel > c.rule->test.tolerance) {
    return absl::InternalError(absl::StrCat("||fused - unfused|| / ||unfused|| = ", rel,
                                            ", over the rule's bound ", c.rule->test.tolerance));
  }
  return absl::OkStatus();
}

}  // namespace opserve::test_support
