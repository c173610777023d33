// opserve-op-table: the op table, for test suites written in another language (the Python
// suites), so that they keep no op list and no per-op reference of their own:
//
//   opserve-op-table describe
//       every op as JSON: name, arity, dtypes, test shapes, empty fill, and its rows (algorithm,
//       backend, dtypes, fallback)
//   opserve-op-table check OP ALGORITHM OUT_DTYPE OUT_SHAPE OUT_FILE (IN_DTYPE IN_SHAPE IN_FILE)...
//       whether OUT_FILE (raw little-endian bytes, BFLOAT16 as its bits) is what ALGORITHM may
//       answer for OP on the inputs: the dtype and shape the op infers, and the CPU reference's
//       values within the op's tolerance for ALGORITHM (tests/support/result_check.h); for an
//       empty input, the op's empty fill. Exit 0 when it is, 1 (saying why) when not.
//   opserve-op-table infer OP (IN_DTYPE IN_SHAPE)...
//       the output's dtype and shape as JSON, or the op's refusal (code and message)
//
// Dtypes are named as in the API ("FLOAT32"); a shape is its dimensions joined by ',' ("4,33"),
// the empty string for a scalar. Usage errors exit 2.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/ops/op.h"
#include "server/ops/host_kernel_env.h"
#include "tests/support/result_check.h"

namespace opserve {
namespace {

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "opserve-op-table: " << why << "\n"
            << "usage: opserve-op-table describe\n"
            << "       opserve-op-table check OP ALGORITHM OUT_DTYPE OUT_SHAPE OUT_FILE "
               "(IN_DTYPE IN_SHAPE IN_FILE)...\n"
            << "       opserve-op-table infer OP (IN_DTYPE IN_SHAPE)...\n";
  std::exit(2);
}

std::string Json(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string Json(const std::vector<std::vector<std::vector<int64_t>>>& cases) {
  std::vector<std::string> out;
  for (const auto& c : cases) {
    std::vector<std::string> shapes;
    for (const auto& s : c) shapes.push_back(Json(s));
    out.push_back(absl::StrCat("[", absl::StrJoin(shapes, ","), "]"));
  }
  return absl::StrCat("[", absl::StrJoin(out, ","), "]");
}

std::string Json(std::span<const DType> dtypes) {
  std::vector<std::string> names;
  for (DType d : dtypes) names.push_back(absl::StrCat("\"", DTypeName(d), "\""));
  return absl::StrCat("[", absl::StrJoin(names, ","), "]");
}

const char* FillName(EmptyFill fill) {
  switch (fill) {
    case EmptyFill::kZeros: return "zeros";
    case EmptyFill::kNaN: return "nan";
    default: return "unknown";
  }
}

int Describe() {
  std::vector<std::string> ops;
  for (const OpSpec& op : Ops()) {
    std::vector<std::string> rows;
    for (const AlgoSpec& a : Algorithms()) {
      if (a.op != op.name) continue;
      rows.push_back(absl::StrCat("{\"name\":\"", a.name, "\",\"backend\":\"", a.backend,
                                  "\",\"dtypes\":", Json(a.dtypes), ",\"fallback\":\"",
                                  a.fallback, "\"}"));
    }
    ops.push_back(absl::StrCat(
        "{\"name\":\"", op.name, "\",\"arity\":", op.arity, ",\"dtypes\":", Json(op.dtypes),
        ",\"small_shapes\":", Json(op.test.small_shapes), ",\"edge_shapes\":",
        Json(op.test.edge_shapes), ",\"empty_fill\":\"", FillName(op.empty_fill),
        "\",\"algorithms\":[", absl::StrJoin(rows, ","), "]}"));
  }
  std::cout << "{\"ops\":[" << absl::StrJoin(ops, ",\n") << "]}\n";
  return 0;
}

DType ParseDType(const std::string& name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  Usage(absl::StrCat("no dtype '", name, "'"));
}

std::vector<int64_t> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  for (absl::string_view d : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(d, &v) || v < 0) Usage(absl::StrCat("bad shape '", text, "'"));
    shape.push_back(v);
  }
  return shape;
}

std::string ReadFile(const std::string& path, uint64_t want_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Usage(absl::StrCat("cannot read ", path));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() != want_bytes) {
    Usage(absl::StrCat(path, " holds ", bytes.size(), " bytes, its dtype and shape ", want_bytes));
  }
  return bytes;
}

const OpSpec& NeedOp(const std::string& name) {
  const OpSpec* op = FindOp(name);
  if (op == nullptr) Usage(absl::StrCat("the op table has no op '", name, "'"));
  return *op;
}

// The inputs named from argv[first] on, `per` arguments each (dtype, shape[, file]).
struct Inputs {
  std::vector<TensorMeta> metas;
  std::vector<std::string> bytes;
  std::vector<const void*> ptrs;
};
Inputs ParseInputs(int argc, char** argv, int first, int per, const OpSpec& op) {
  if ((argc - first) % per != 0 || (argc - first) / per != op.arity) {
    Usage(absl::StrCat(op.name, " takes ", op.arity, " inputs"));
  }
  Inputs in;
  for (int i = first; i < argc; i += per) {
    in.metas.push_back({ParseDType(argv[i]), ParseShape(argv[i + 1])});
    if (per == 3) in.bytes.push_back(ReadFile(argv[i + 2], in.metas.back().Bytes()));
  }
  for (const std::string& b : in.bytes) in.ptrs.push_back(b.data());
  return in;
}

int Infer(int argc, char** argv) {
  if (argc < 3) Usage("infer needs an op");
  const OpSpec& op = NeedOp(argv[2]);
  const Inputs in = ParseInputs(argc, argv, 3, 2, op);
  const absl::StatusOr<TensorMeta> out = op.infer(in.metas);
  if (!out.ok()) {
    std::string message(out.status().message());
    for (char& c : message) c = c == '"' || c == '\\' ? '\'' : c;
    std::cout << "{\"ok\":false,\"code\":\"" << absl::StatusCodeToString(out.status().code())
              << "\",\"message\":\"" << message << "\"}\n";
  } else {
    std::cout << "{\"ok\":true,\"dtype\":\"" << DTypeName(out->dtype)
              << "\",\"shape\":" << Json(out->shape) << "}\n";
  }
  return 0;
}

int Fail(const std::string& why) {
  std::cout << why << "\n";
  return 1;
}

int Check(int argc, char** argv) {
  if (argc < 7) Usage("check needs an op, an algorithm and an output");
  const OpSpec& op = NeedOp(argv[2]);
  const std::string algorithm = argv[3];
  const TensorMeta got_meta{ParseDType(argv[4]), ParseShape(argv[5])};
  const std::string got = ReadFile(argv[6], got_meta.Bytes());
  const Inputs in = ParseInputs(argc, argv, 7, 3, op);
  const absl::StatusOr<TensorMeta> want = op.infer(in.metas);
  if (!want.ok()) return Fail(absl::StrCat("the op refuses these inputs: ", want.status().message()));
  if (got_meta.dtype != want->dtype || got_meta.shape != want->shape) {
    return Fail(absl::StrCat("output ", got_meta.DebugString(), ", the op infers ",
                             want->DebugString()));
  }
  bool empty = false;
  for (const TensorMeta& m : in.metas) empty = empty || m.NumElements() == 0;
  if (empty) {  // no kernel runs: the output is the op's fill
    const char fill = op.empty_fill == EmptyFill::kNaN ? '\xff' : '\0';
    if (op.empty_fill != EmptyFill::kNaN && op.empty_fill != EmptyFill::kZeros) {
      return Fail(absl::StrCat("an empty fill this tool does not know: ",
                               static_cast<int>(op.empty_fill)));
    }
    if (got != std::string(got.size(), fill)) {
      return Fail(absl::StrCat("an empty input's output is not all ", FillName(op.empty_fill)));
    }
    std::cout << "ok: " << FillName(op.empty_fill) << "\n";
    return 0;
  }
  std::string reference(want->Bytes(), '\0');
  HostKernelEnv env;
  AttrMap attrs;
  const KernelArgs args{in.ptrs, in.metas, reference.data(), *want, attrs, env};
  if (absl::Status s = CpuReference(op.name)->run(args); !s.ok()) {
    return Fail(absl::StrCat("the CPU reference failed: ", s.message()));
  }
  const OpResult result{op, in.metas, in.ptrs, *want, got.data(), reference.data()};
  if (absl::Status s = CheckResult(result, algorithm); !s.ok()) return Fail(std::string(s.message()));
  std::cout << "ok: relative error " << *RelativeError(result) << "\n";
  return 0;
}

}  // namespace
}  // namespace opserve

int main(int argc, char** argv) {
  if (argc < 2) opserve::Usage("no command");
  const std::string command = argv[1];
  if (command == "describe") return opserve::Describe();
  if (command == "infer") return opserve::Infer(argc, argv);
  if (command == "check") return opserve::Check(argc, argv);
  opserve::Usage(absl::StrCat("no command '", command, "'"));
}
