#include "tests/soak/malformed.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "tests/e2e/e2e_fixture.h"

namespace opserve::soak {
namespace {

using Code = absl::StatusCode;

// ---- PutTensor streams, sent as they are through the generated stub ----

v1::PutTensorRequest Header(const std::string& name, int dtype, std::vector<int64_t> shape) {
  v1::PutTensorRequest m;
  v1::PutTensorHeader* h = m.mutable_header();
  h->set_name(name);
  h->set_dtype(static_cast<v1::DType>(dtype));  // proto3 enums are open: any int travels
  for (int64_t d : shape) h->add_shape(d);
  return m;
}

v1::PutTensorRequest Chunk(size_t bytes) {
  v1::PutTensorRequest m;
  m.set_chunk(std::string(bytes, '\x01'));
  return m;
}

absl::Status RawPut(MalformedContext& ctx, const std::vector<v1::PutTensorRequest>& messages) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + ctx.timeout));
  context.set_wait_for_ready(true);  // as the soak clients: ride out reconnects
  v1::PutTensorResponse response;
  auto writer = ctx.stub.PutTensor(&context, &response);
  // A failed write means the server already ended the call; Finish says how.
  for (const v1::PutTensorRequest& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return client::ToAbslStatus(writer->Finish());
}

std::string Bad(const MalformedContext& ctx, absl::string_view what) {
  return absl::StrCat(ctx.bad_prefix, what);
}

// ---- Execute requests (builders from tests/e2e/e2e_fixture.h) ----

using e2e::AddInline;
using e2e::AddNode;
using e2e::AddOutput;
using e2e::In;

absl::Status Execute(MalformedContext& ctx, const v1::ExecuteRequest& r) {
  return ctx.client.Execute(r, {.timeout = ctx.timeout}).status();
}

// A well-formed one-node graph over an inline FLOAT32[rows, cols] "x", returned inline; the
// rows below break one thing each.
v1::ExecuteRequest Valid(const std::string& op = "row_sum") {
  v1::ExecuteRequest r;
  AddNode(r, "n", op, {{In::kInline, "x"}});
  AddInline(r, "x", v1::FLOAT32, {4, 8});
  AddOutput(r, "n", true);
  return r;
}

const MalformedKind kKinds[] = {
    // -- PutTensor --
    {"put_dtype_unspecified", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), 0, {4}), Chunk(16)});
     }},
    {"put_dtype_out_of_range", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), 99, {4}), Chunk(16)});
     }},
    {"put_fewer_bytes_than_shape", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, {4, 4}), Chunk(32), Chunk(28)});
     }},
    {"put_more_bytes_than_shape", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, {4}), Chunk(16), Chunk(4)});
     }},
    {"put_chunk_before_header", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Chunk(16), Header(Bad(c, "p"), v1::FLOAT32, {4})});
     }},
    {"put_second_header", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, {4}),
                         Header(Bad(c, "p"), v1::FLOAT32, {4}), Chunk(16)});
     }},
    {"put_empty_stream", Code::kInvalidArgument, [](MalformedContext& c) { return RawPut(c, {}); }},
    {"put_message_without_kind", Code::kInvalidArgument,
     [](MalformedContext& c) { return RawPut(c, {v1::PutTensorRequest()}); }},
    {"put_zero_dimension_hiding_a_negative", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, {0, -4})});
     }},
    {"put_negative_dimension", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, {-3}), Chunk(12)});
     }},
    {"put_rank_over_limit", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, std::vector<int64_t>(9, 1)), Chunk(4)});
     }},
    {"put_name_with_space", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "has space"), v1::FLOAT32, {1}), Chunk(4)});
     }},
    {"put_empty_name", Code::kInvalidArgument,
     [](MalformedContext& c) {
       return RawPut(c, {Header("", v1::FLOAT32, {1}), Chunk(4)});
     }},
    {"put_over_max_tensor_bytes", Code::kResourceExhausted,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32,
                                {static_cast<int64_t>(kMemoryBudgetBytes / 4) + 1})});
     }},
    {"put_shape_overflows_64_bits", Code::kResourceExhausted,
     [](MalformedContext& c) {
       return RawPut(c, {Header(Bad(c, "p"), v1::FLOAT32, {int64_t{1} << 62, int64_t{1} << 62})});
     }},
    {"put_existing_name_without_overwrite", Code::kAlreadyExists,
     [](MalformedContext& c) {
       const float values[4] = {1, 2, 3, 4};
       return c.client
           .PutTensor(c.anchor, v1::FLOAT32, {4}, values, sizeof values, /*overwrite=*/false,
                      {.timeout = c.timeout})
           .status();
     }},
    // -- GetTensor, DeleteTensor --
    {"get_missing_tensor", Code::kNotFound,
     [](MalformedContext& c) {
       return c.client.GetTensor(Bad(c, "never"), {.timeout = c.timeout}).status();
     }},
    {"delete_missing_tensor", Code::kNotFound,
     [](MalformedContext& c) {
       return c.client.DeleteTensor(Bad(c, "never"), {.timeout = c.timeout}).status();
     }},
    // -- Execute --
    {"exec_empty_graph", Code::kInvalidArgument,
     [](MalformedContext& c) { return Execute(c, v1::ExecuteRequest()); }},
    {"exec_unknown_op", Code::kInvalidArgument,
     [](MalformedContext& c) { return Execute(c, Valid("softmax")); }},
    {"exec_cycle", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "a", "transpose", {{In::kNode, "b"}});
       AddNode(r, "b", "transpose", {{In::kNode, "a"}});
       AddOutput(r, "a", true);
       return Execute(c, r);
     }},
    {"exec_self_loop", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "a", "transpose", {{In::kNode, "a"}});
       AddOutput(r, "a", true);
       return Execute(c, r);
     }},
    {"exec_missing_stored_tensor", Code::kNotFound,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "sum", {{In::kStored, Bad(c, "never")}});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_inline_bytes_mismatch", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddInline(r, "x", v1::FLOAT32, {4, 8}, /*bytes=*/4 * 8 * 4 - 1);
       return Execute(c, r);
     }},
    {"exec_inline_dtype_unspecified", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddInline(r, "x", v1::DTYPE_UNSPECIFIED, {4, 8}, /*bytes=*/128);
       return Execute(c, r);
     }},
    {"exec_inline_negative_dimension", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddInline(r, "x", v1::FLOAT32, {4, -8}, /*bytes=*/0);
       return Execute(c, r);
     }},
    {"exec_inline_name_with_space", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "sum", {{In::kInline, "x y"}});
       AddInline(r, "x y", v1::FLOAT32, {4});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_wrong_arity", Code::kInvalidArgument,
     [](MalformedContext& c) { return Execute(c, Valid("matmul")); }},
    {"exec_dtype_the_op_refuses", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "matmul", {{In::kInline, "x"}, {In::kInline, "x"}});
       AddInline(r, "x", v1::INT32, {4, 4});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_wrong_rank", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid("row_mean");
       AddInline(r, "x", v1::FLOAT32, {32});
       return Execute(c, r);
     }},
    {"exec_matmul_inner_mismatch", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "matmul", {{In::kInline, "a"}, {In::kInline, "b"}});
       AddInline(r, "a", v1::FLOAT32, {4, 8});
       AddInline(r, "b", v1::FLOAT32, {7, 4});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_matmul_dtype_mismatch", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "matmul", {{In::kInline, "a"}, {In::kInline, "b"}});
       AddInline(r, "a", v1::FLOAT32, {4, 8});
       AddInline(r, "b", v1::BFLOAT16, {8, 4});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_unknown_algorithm", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       r.mutable_nodes(0)->set_algorithm("no_such_algorithm");
       return Execute(c, r);
     }},
    {"exec_duplicate_node_id", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddNode(r, "n", "row_mean", {{In::kInline, "x"}});
       return Execute(c, r);
     }},
    {"exec_empty_node_id", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddNode(r, "", "row_mean", {{In::kInline, "x"}});
       return Execute(c, r);
     }},
    {"exec_input_names_absent_node", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddNode(r, "m", "transpose", {{In::kNode, "absent"}});
       return Execute(c, r);
     }},
    {"exec_input_without_source", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "sum", {{In::kNone, ""}});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_inline_name_not_in_request", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r;
       AddNode(r, "n", "sum", {{In::kInline, "absent"}});
       AddOutput(r, "n", true);
       return Execute(c, r);
     }},
    {"exec_unknown_attribute", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       (*r.mutable_nodes(0)->mutable_attrs())["axis"].set_i(1);
       return Execute(c, r);
     }},
    {"exec_output_of_absent_node", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddOutput(r, "absent", true);
       return Execute(c, r);
     }},
    {"exec_output_goes_nowhere", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddOutput(r, "n", false);
       return Execute(c, r);
     }},
    {"exec_two_outputs_one_name", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddNode(r, "m", "row_mean", {{In::kInline, "x"}});
       AddOutput(r, "n", false, Bad(c, "twice"));
       AddOutput(r, "m", false, Bad(c, "twice"));
       return Execute(c, r);
     }},
    {"exec_store_as_bad_name", Code::kInvalidArgument,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddOutput(r, "n", false, Bad(c, "has space"));
       return Execute(c, r);
     }},
    {"exec_store_over_existing_without_overwrite", Code::kAlreadyExists,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       AddOutput(r, "n", false, c.anchor);
       return Execute(c, r);
     }},
    {"exec_too_many_nodes", Code::kResourceExhausted,
     [](MalformedContext& c) {
       v1::ExecuteRequest r = Valid();
       for (int i = 0; i < kMaxGraphNodes; ++i) {
         AddNode(r, absl::StrCat("extra", i), "row_sum", {{In::kInline, "x"}});
       }
       return Execute(c, r);
     }},
    {"exec_output_over_max_tensor_bytes", Code::kResourceExhausted,
     [](MalformedContext& c) {
       // [16384, 1] x [1, 16384]: 128 KiB of inputs, a 1 GiB output over the 256 MiB limit.
       v1::ExecuteRequest r;
       AddNode(r, "n", "matmul", {{In::kInline, "a"}, {In::kInline, "b"}});
       AddInline(r, "a", v1::FLOAT32, {16384, 1});
       AddInline(r, "b", v1::FLOAT32, {1, 16384});
       AddOutput(r, "n", false, Bad(c, "huge"));
       return Execute(c, r);
     }},
};

}  // namespace

std::span<const MalformedKind> MalformedKinds() { return kKinds; }

}  // namespace opserve::soak
