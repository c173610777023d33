#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/: small valid and near-valid inputs.

The protobuf inputs are encoded by hand (the wire format is a few lines), so the script needs
nothing beyond Python 3. Run it from anywhere; it rewrites the corpus directories:

    python3 tests/fuzz/make_corpus.py

The fixture names used here (stored tensors A, B, I, H, L, S, big and tenant's secret; the
.npy files a.npy, b.npy, ...) are those the fuzz targets set up.
"""
import base64
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FLOAT32, INT32, INT64, BFLOAT16 = 1, 2, 3, 4


# ---- protobuf wire format ----
def varint(n):
    n &= (1 << 64) - 1  # negative int64 -> two's complement, 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(field, wire_type):
    return varint(field << 3 | wire_type)


def vi(field, n):
    return key(field, 0) + varint(n)


def ld(field, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return key(field, 2) + varint(len(payload)) + payload


def f64(field, x):
    return key(field, 1) + struct.pack("<d", x)


def packed(field, values):
    return ld(field, b"".join(varint(v) for v in values))


# ---- opserve.v1 messages ----
def attr(i=None, f=None, s=None, b=None):
    if i is not None:
        return vi(1, i)
    if f is not None:
        return f64(2, f)
    if s is not None:
        return ld(3, s)
    return vi(4, 1 if b else 0)


def inp(stored=None, inline=None, node=None, none=False):
    if none:
        return b""
    if stored is not None:
        return ld(1, stored)
    if inline is not None:
        return ld(2, inline)
    return ld(3, node)


def node(id, op, inputs, algorithm="", attrs=None):
    out = ld(1, id) + ld(2, op)
    if algorithm:
        out += ld(3, algorithm)
    for k, v in (attrs or {}).items():
        out += ld(4, ld(1, k) + ld(2, v))
    for i in inputs:
        out += ld(5, i)
    return out


ELEM = {FLOAT32: 4, INT32: 4, INT64: 8, BFLOAT16: 2}


def tensor(dtype, shape, data=None):
    if data is None:
        n = 1
        for d in shape:
            n *= d
        data = bytes((i * 37) % 251 for i in range(n * ELEM[dtype]))
    out = vi(1, dtype)
    if shape:
        out += packed(2, shape)
    return out + ld(3, data)


def output(node_id, ret=False, store_as="", overwrite=False):
    out = ld(1, node_id)
    if ret:
        out += vi(2, 1)
    if store_as:
        out += ld(3, store_as)
    if overwrite:
        out += vi(4, 1)
    return out


def request(nodes=(), inlines=None, outputs=()):
    out = b"".join(ld(1, n) for n in nodes)
    for name, t in (inlines or {}).items():
        out += ld(2, ld(1, name) + ld(2, t))
    return out + b"".join(ld(3, o) for o in outputs)


def put_header(name, dtype, shape, overwrite=False):
    h = ld(1, name) + vi(2, dtype)
    if shape:
        h += packed(3, shape)
    if overwrite:
        h += vi(4, 1)
    return ld(1, h)


def put_chunk(data):
    return ld(2, data)


def put_stream(messages, abandon=False, tenant=False):
    out = bytes([(1 if abandon else 0) | (2 if tenant else 0)])
    for m in messages:
        out += struct.pack("<H", len(m)) + m
    return out


# ---- .npy ----
def npy(descr="<f4", shape=(2, 3), data=None, version=(1, 0), header=None, fortran="False",
        elem=4, pad=True):
    if header is None:
        dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, fortran, dims)
    pre = 10 if version[0] == 1 else 12
    if pad:
        total = (pre + len(header) + 1 + 63) // 64 * 64
        header = header + " " * (total - pre - len(header) - 1) + "\n"
    head = header.encode("latin-1")
    length = struct.pack("<H" if version[0] == 1 else "<I", len(head))
    if data is None:
        n = 1
        for d in shape:
            n *= d
        data = bytes((i * 13) % 256 for i in range(n * elem))
    return b"\x93NUMPY" + bytes(version) + length + head + data


def execute_plan_seeds():
    A, B, S, H, L = (inp(stored=x) for x in "ABSHL")
    ret = lambda n: output(n, ret=True)
    bf = tensor(BFLOAT16, [8, 2])
    return {
        "sum_stored": request([node("s", "sum", [A])], outputs=[ret("s")]),
        "sum_int_inline": request([node("s", "sum", [inp(inline="x")])],
                                  {"x": tensor(INT32, [2, 3])}, [ret("s")]),
        "scalar_sum": request([node("s", "sum", [S])], outputs=[ret("s")]),
        "matmul_stored": request([node("mm", "matmul", [A, inp(stored="B")], "reference")],
                                 outputs=[ret("mm")]),
        "chain": request([node("t", "transpose", [inp(node="mm")]),
                          node("mm", "matmul", [A, inp(stored="B")]),
                          node("rm", "row_mean", [inp(node="t")]),
                          node("rs", "row_sum", [inp(node="mm")], "auto"),
                          node("s", "sum", [inp(node="rm")])],
                         outputs=[ret("s"), output("mm", store_as="C"), ret("rs")]),
        "inline_transpose": request([node("t", "transpose", [inp(inline="x")])],
                                    {"x": tensor(INT32, [2, 3])},
                                    [output("t", ret=True, store_as="xt")]),
        "bf16_matmul": request([node("mm", "matmul", [H, inp(inline="w")])], {"w": bf}, [ret("mm")]),
        "int64_transpose": request([node("t", "transpose", [L])], outputs=[ret("t")]),
        "store_overwrite": request([node("t", "transpose", [A])],
                                   outputs=[output("t", store_as="B", overwrite=True)]),
        "tenant_secret": request([node("s", "sum", [inp(stored="secret")])], outputs=[ret("s")]),
        "big_matmul": request([node("t", "transpose", [inp(stored="big")]),
                               node("mm", "matmul", [inp(stored="big"), inp(node="t")])],
                              outputs=[output("mm", store_as="huge")]),
        "big_returned": request([node("t", "transpose", [inp(stored="big")])], outputs=[ret("t")]),
        # Fusion: each rule's pair, one with fuse=false, one chain of two rules.
        "fused_matmul_t": request([node("t", "transpose", [inp(node="mm")]),
                                   node("mm", "matmul", [A, inp(stored="B")])], outputs=[ret("t")]),
        "fused_col_mean": request([node("m", "row_mean", [inp(node="t")]),
                                   node("t", "transpose", [A])], outputs=[ret("m")]),
        "fused_sum": request([node("s", "sum", [inp(node="r")]), node("r", "row_sum", [A])],
                             outputs=[ret("s")]),
        "fuse_false": request([node("m", "row_sum", [inp(node="t")], attrs={"fuse": attr(b=False)}),
                               node("t", "transpose", [A])], outputs=[ret("m")]),
        "fused_chain": request([node("s", "sum", [inp(node="r")]), node("r", "row_sum", [inp(node="t")]),
                                node("t", "transpose", [inp(node="mm")]),
                                node("mm", "matmul", [A, inp(stored="B")])], outputs=[ret("s")]),
        # The reproducer CI's fuzzing found: transpose(matmul(A, B)) fused, whose node reads two
        # inputs (the invariant had assumed the op's own arity).
        "crash_fused_arity": base64.b64decode(
            "ChQKAXQSCXRyYW5zcG9zZSoEGgJtbQoWCgJtbRIGbWF0bXVsKgMKAUEqAwoBQg=="),
        # Near-valid: one thing wrong each.
        "empty": b"",
        "cycle": request([node("a", "transpose", [inp(node="b")]),
                          node("b", "transpose", [inp(node="a")])], outputs=[ret("a")]),
        "self_loop": request([node("a", "transpose", [inp(node="a")])], outputs=[ret("a")]),
        "duplicate_id": request([node("a", "sum", [A]), node("a", "sum", [A])]),
        "empty_id": request([node("", "sum", [A])]),
        "unknown_op": request([node("x", "conv2d", [A])]),
        "arity": request([node("mm", "matmul", [A])]),
        "dangling": request([node("s", "sum", [inp(node="nope")])]),
        "missing_inline": request([node("s", "sum", [inp(inline="x")])]),
        "missing_stored": request([node("s", "sum", [inp(stored="Q")])]),
        "no_source": request([node("s", "sum", [inp(none=True)])]),
        "bad_dtype": request([node("s", "sum", [inp(inline="x")])], {"x": tensor(7, [2], b"\0" * 8)}),
        "overflow_shape": request([node("s", "sum", [inp(inline="x")])],
                                  {"x": tensor(FLOAT32, [1 << 62, 4], b"")}),
        "negative_dim": request([node("s", "sum", [inp(inline="x")])],
                                {"x": tensor(FLOAT32, [-3, 2], b"")}),
        "rank5": request([node("s", "sum", [inp(inline="x")])],
                         {"x": tensor(FLOAT32, [1, 1, 1, 1, 1])}),
        "data_size": request([node("s", "sum", [inp(inline="x")])],
                             {"x": tensor(FLOAT32, [2, 2], b"\0" * 15)}),
        "bad_inline_name": request([node("s", "sum", [inp(inline="x y")])],
                                   {"x y": tensor(FLOAT32, [1])}),
        "shape_mismatch": request([node("mm", "matmul", [A, A])]),
        "dtype_mismatch": request([node("mm", "matmul", [A, H])]),
        "row_mean_int": request([node("r", "row_mean", [inp(stored="I")])]),
        "unknown_attr": request([node("s", "sum", [A], attrs={"axis": attr(i=1)})]),
        "attrs_all_kinds": request([node("s", "sum", [A], attrs={"a": attr(f=0.5), "b": attr(s="x"),
                                                                  "c": attr(b=True), "d": b""})]),
        "unknown_algorithm": request([node("mm", "matmul", [A, inp(stored="B")], "cublas")]),
        "no_output_kind": request([node("s", "sum", [A])], outputs=[output("s")]),
        "output_unknown_node": request([node("s", "sum", [A])], outputs=[ret("z")]),
        "store_bad_name": request([node("s", "sum", [A])], outputs=[output("s", store_as="../x")]),
        "store_twice": request([node("s", "sum", [A]), node("t", "sum", [A])],
                               outputs=[output("s", store_as="K"), output("t", store_as="K")]),
        "store_exists": request([node("s", "sum", [A])], outputs=[output("s", store_as="A")]),
        "too_many_nodes": request([node("n%d" % i, "sum", [A]) for i in range(257)]),
    }


def put_assembly_seeds():
    f32 = lambda n: bytes((i * 7) % 256 for i in range(n))
    return {
        "ok_two_chunks": put_stream([put_header("T", FLOAT32, [2, 3]), put_chunk(f32(8)),
                                     put_chunk(f32(16))]),
        "ok_scalar_int64": put_stream([put_header("s", INT64, []), put_chunk(f32(8))]),
        "ok_bf16_three_chunks": put_stream([put_header("h.b", BFLOAT16, [3]), put_chunk(f32(2)),
                                            put_chunk(b""), put_chunk(f32(2)), put_chunk(f32(2))]),
        "ok_overwrite": put_stream([put_header("A", FLOAT32, [2, 3], overwrite=True),
                                    put_chunk(f32(24))]),
        "ok_tenant": put_stream([put_header("A", INT32, [4]), put_chunk(f32(16))], tenant=True),
        "ok_rank4": put_stream([put_header("r4", INT32, [1, 2, 1, 2]), put_chunk(f32(16))]),
        "exists": put_stream([put_header("A", FLOAT32, [2, 3]), put_chunk(f32(24))]),
        "exists_tenant": put_stream([put_header("B", INT32, [4]), put_chunk(f32(16))], tenant=True),
        "short": put_stream([put_header("T", FLOAT32, [2, 3]), put_chunk(f32(10))]),
        "long": put_stream([put_header("T", FLOAT32, [2, 3]), put_chunk(f32(20)), put_chunk(f32(8))]),
        "abandoned": put_stream([put_header("T", FLOAT32, [2, 3]), put_chunk(f32(12))], abandon=True),
        "abandoned_complete": put_stream([put_header("T", FLOAT32, [1]), put_chunk(f32(4))],
                                         abandon=True),
        "chunk_first": put_stream([put_chunk(f32(4)), put_header("T", FLOAT32, [1])]),
        "two_headers": put_stream([put_header("T", FLOAT32, [1]), put_header("U", FLOAT32, [1])]),
        "header_only": put_stream([put_header("T", FLOAT32, [1])]),
        "nothing": put_stream([]),
        "empty_message": put_stream([b""]),
        "over_budget": put_stream([put_header("T", FLOAT32, [128, 128]), put_chunk(f32(4))]),
        "over_limit": put_stream([put_header("T", FLOAT32, [129, 128])]),
        "overflow": put_stream([put_header("T", INT64, [1 << 62, 1 << 62])]),
        "zero_dim": put_stream([put_header("T", FLOAT32, [0, 3])]),
        "negative_dim": put_stream([put_header("T", FLOAT32, [-1])]),
        "rank5": put_stream([put_header("T", FLOAT32, [1, 1, 1, 1, 1])]),
        "bad_dtype": put_stream([put_header("T", 9, [1]), put_chunk(f32(4))]),
        "bad_name": put_stream([put_header("a b", FLOAT32, [1]), put_chunk(f32(4))]),
        "long_name": put_stream([put_header("n" * 257, FLOAT32, [1]), put_chunk(f32(4))]),
        "garbage_message": put_stream([put_header("T", FLOAT32, [1]), b"\xff\xff\xff"]),
    }


def npy_seeds():
    return {
        "f4_2x3": npy(),
        "i4_scalar": npy("<i4", ()),
        "i8_5": npy("<i8", (5,), elem=8),
        "f4_zero_size": npy("<f4", (0, 5)),
        "v2_f4_2x2": npy("<f4", (2, 2), version=(2, 0)),
        "python2_long": npy(header="{'descr': '<i4', 'fortran_order': False, 'shape': (3L, 2L), }",
                            shape=(3, 2)),
        "reordered_keys": npy(header="{\"shape\": (1,1),'fortran_order':False,'descr':'<f4'}",
                              shape=(1, 1)),
        "unpadded": npy(pad=False, shape=(1,)),
        "big_endian": npy(">f4"),
        "float64": npy("<f8", elem=8),
        "fortran": npy(fortran="True"),
        "truncated_data": npy(data=b"\0" * 23),
        "trailing_bytes": npy(data=b"\0" * 25),
        "header_past_end": b"\x93NUMPY\x01\x00\xff\x7f{'descr'",
        "version_3": npy(version=(3, 0)),
        "bad_magic": b"\x93NUMPX\x01\x00\x00\x00",
        "preamble_only": b"\x93NUMPY\x02\x00\x10",
        "no_shape": npy(header="{'descr': '<f4', 'fortran_order': False, }"),
        "negative_dim": npy(header="{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
        "duplicate_key": npy(header="{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                                    "'shape': (), }", shape=()),
        "overflow_dims": npy(header="{'descr': '<f4', 'fortran_order': False, "
                                    "'shape': (4611686018427387904, 4), }", data=b""),
        "huge_dim": npy(header="{'descr': '<f4', 'fortran_order': False, "
                               "'shape': (99999999999999999999,), }", data=b""),
        "unterminated": npy(header="{'descr': '<f4", data=b""),
        "rank33": npy(header="{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }"
                      % ("1," * 33), data=b"\0" * 4),
    }


def graph_json_seeds():
    return {
        "doc_example.json": '{"nodes": [{"id": "mm", "op": "matmul", "inputs": [{"stored": "A"}, '
                            '{"inlineName": "B"}]}], "inlineTensors": {"B": {"npy": "b.npy"}}, '
                            '"outputs": [{"node": "mm", "returnInline": true}]}',
        "stored_sum.json": '{"nodes":[{"id":"s","op":"sum","inputs":[{"stored":"A"}]}],'
                           '"outputs":[{"node":"s","returnInline":true}]}',
        "snake_case.json": '{"nodes":[{"id":"t","op":"transpose","algorithm":"auto",'
                           '"inputs":[{"inline_name":"x"}]}],"inline_tensors":{"x":{"dtype":"INT32",'
                           '"shape":["2","2"],"data":"AQAAAAIAAAADAAAABAAAAA=="}},'
                           '"outputs":[{"node":"t","store_as":"xt","overwrite":true}]}',
        "mixed_npy.json": '{"nodes":[{"id":"a","op":"sum","inputs":[{"inlineName":"i"}]},'
                          '{"id":"b","op":"row_sum","inputs":[{"inlineName":"c"}]}],'
                          '"inlineTensors":{"i":{"npy":"i.npy"},"c":{"npy":"sub/c.npy"},'
                          '"s":{"npy":"s.npy"},"l":{"npy":"l.npy"},'
                          '"x":{"dtype":"FLOAT32","shape":[1],"data":"AACAPw=="}},'
                          '"outputs":[{"node":"a","returnInline":true},{"node":"b","storeAs":"rs"}]}',
        "attrs.json": '{"nodes":[{"id":"s","op":"sum","inputs":[{"stored":"A"}],"attrs":{'
                      '"i":{"i":"9007199254740993"},"f":{"f":0.25},"s":{"s":"x"},"b":{"b":true},'
                      '"n":{"f":"NaN"}}}]}',
        "big_number.json": '{"nodes":[{"id":"s","op":"sum","attrs":{"i":{"i":9007199254740993}}}]}',
        "npy_missing.json": '{"inlineTensors":{"x":{"npy":"missing.npy"}}}',
        "npy_short.json": '{"inlineTensors":{"x":{"npy":"short.npy"}}}',
        "npy_text.json": '{"inlineTensors":{"x":{"npy":"text.npy"}}}',
        "npy_empty_file.json": '{"inlineTensors":{"x":{"npy":"empty.npy"}}}',
        "npy_extra_field.json": '{"inlineTensors":{"x":{"npy":"a.npy","dtype":"FLOAT32"}}}',
        "npy_not_string.json": '{"inlineTensors":{"x":{"npy":3}}}',
        "npy_empty_path.json": '{"inlineTensors":{"x":{"npy":""}}}',
        "npy_directory.json": '{"inlineTensors":{"x":{"npy":"sub"}}}',
        "both_spellings.json": '{"inlineTensors":{"x":{"npy":"a.npy"}},'
                               '"inline_tensors":{"x":{"dtype":"FLOAT32","shape":[1],"data":"AAAAAA=="}}}',
        "inline_not_object.json": '{"inlineTensors":{"x":[1,2]}}',
        "inline_list.json": '{"inlineTensors":[]}',
        "root_array.json": '[{"id":"s"}]',
        "unknown_field.json": '{"nodes":[],"foo":1}',
        "bad_enum.json": '{"inlineTensors":{"x":{"dtype":"FLOAT64","shape":[1],"data":""}}}',
        "not_json.json": '{"nodes": [',
        "nested.json": '{"nodes":[{"id":"s","attrs":{"a":{"s":"' + "[" * 20 + '"}}}],"x":' +
                       "[" * 40 + "]" * 40 + "}",
    }


def model_infer_parse_seeds():
    """fuzz_model_infer_parse: byte 0 sets the slice size (1 + byte), then a ModelInferRequest.
    Fields: model_name 1, id 3, parameters 4, inputs 5 (name 1, datatype 2, shape 3),
    raw_input_contents 7; entries of 8 bytes and more are lifted."""
    x = ld(1, b"x") + ld(2, b"FP32") + packed(3, [2, 3])
    algo = ld(4, ld(1, b"algorithm") + ld(2, ld(3, b"auto")))
    base = ld(1, b"row_mean") + ld(3, b"r1") + algo + ld(5, x)
    raw24 = ld(7, struct.pack("<6f", 1, 2, 3, 4, 5, 6))
    return {
        "one_raw_entry": b"\x06" + base + raw24,
        "raw_first": b"\x00" + raw24 + base,
        "small_and_large": b"\x02" + base + ld(7, b"abc") + raw24 + ld(7, b"") + raw24,
        "interleaved": b"\x10" + raw24 + ld(1, b"matmul") + raw24 + ld(5, x) + ld(7, b"tiny"),
        "raw_cut_short": b"\x03" + base + key(7, 2) + varint(24) + b"\x00" * 10,
        "raw_length_huge": b"\x01" + base + key(7, 2) + varint(1 << 31) + b"abc",
        "raw_as_varint": b"\x05" + base + vi(7, 42),
        "unknown_field": b"\x07" + base + ld(99, b"whatever") + raw24,
        "not_utf8_name": b"\x04" + ld(1, b"\xff\xfe") + raw24,
        "group": b"\x08" + base + key(50, 3) + vi(1, 1) + key(50, 4) + raw24,
        "empty": b"\x00",
        # Found by the fuzzer: a 7-byte tag (CodedInputStream keeps its low bits, protobuf
        # refuses it), and map entries beside unknown fixed32 fields.
        "tag_of_seven_bytes": bytes.fromhex("020a08726f775f6d65216e1a027242d2d2d2d2d2d222130a000000000000001e6e1a0272006f775f6e1a"),
        "map_entries_and_unknown_fixed32": bytes.fromhex("2e22002d302d2d2d2d972d2d2d3d2d2d2d6e1a02723122130a09616c676f726974686d12061a0461752d2d2d2d2d2d2d2d2d2d332d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d"),
    }


def execute_lift_seeds():
    """fuzz_model_infer_parse's ExecuteRequest mode: byte 0 has bit 7 set. inline_tensors 2 is a
    map of entries {key 1, value 2: Tensor {dtype 1, shape 2, data 3, shm 4}}."""
    def entry(name, data, shm=None):
        value = vi(1, FLOAT32) + packed(2, [len(data) // 4]) + ld(3, data)
        if shm:
            value += ld(4, ld(1, shm))
        return ld(2, ld(1, name) + ld(2, value))
    node_s = ld(1, node("s", "sum", [inp(inline="x")]))
    x = struct.pack("<4f", 1, 2, 3, 4)
    return {
        "x_inline": b"\x86" + node_s + entry("x", x) + ld(3, ld(1, "s") + vi(2, 1)),
        "value_before_key": b"\x83" + ld(2, ld(2, vi(1, FLOAT32) + ld(3, x)) + ld(1, "x")),
        "repeated_key": b"\x90" + entry("x", x) + entry("x", b"tiny") + entry("x", x + x),
        "two_values_merge": b"\x81" + ld(2, ld(1, "x") + ld(2, ld(3, x)) + ld(2, vi(1, FLOAT32))),
        "data_and_shm": b"\x84" + entry("x", x, shm="r"),
        "entry_cut_short": b"\x82" + key(2, 2) + varint(40) + ld(1, "x"),
        # The value claims 100 bytes inside an entry that ends after 6 of them, and the message
        # goes on: protobuf refuses it (found in review).
        "value_past_its_entry": b"\x85" + ld(2, ld(1, "x") + key(2, 2) + varint(100) + ld(3, "abcd")) +
                                ld(15, b"t" * 200),
    }


def http_infer_seeds():
    """fuzz_http_infer: bytes 0-1 (little-endian) modulo the rest's length + 1 split the rest into
    the JSON header and the binary data after it."""
    def body(header, binary=b""):
        if isinstance(header, str):
            header = header.encode()
        return struct.pack("<H", len(header)) + header + binary

    def infer(inputs, extra=""):
        return '{"id": "r1", %s"inputs": [%s]}' % (extra, ", ".join(inputs))

    def data(datatype, values, order="dt_first"):
        if order == "dt_first":
            return '{"name": "x", "shape": [2], "datatype": "%s", "data": %s}' % (datatype, values)
        return '{"data": %s, "name": "x", "shape": [2], "datatype": "%s"}' % (values, datatype)

    def binary(size, datatype="FP32"):
        return ('{"name": "b", "shape": [%d], "datatype": "%s", '
                '"parameters": {"binary_data_size": %d}}' % (size // 4, datatype, size))

    outputs = '"outputs": [{"name": "y", "parameters": {"binary_data": true}}], '
    return {
        "fp32": body(infer([data("FP32", "[1.5, -2.25e3]")])),
        "fp32_nested": body(infer([data("FP32", "[[0.1], [NaN, -Infinity]]")])),
        "data_before_datatype": body(infer([data("FP32", "[1, 2]", order="data_first")])),
        "bf16": body(infer([data("BF16", "[3.4028236e38, 1e-46]")])),
        "int32_limits": body(infer([data("INT32", "[2147483647, -2147483648]")])),
        "int32_past": body(infer([data("INT32", "[2147483648, 1]")])),
        "int64_limits": body(infer([data("INT64", "[9223372036854775807, -9223372036854775808]")])),
        "int64_float": body(infer([data("INT64", "[1.0, 2]")])),
        "not_a_number": body(infer([data("FP32", '[1, "a", null]')])),
        "object_in_data": body(infer([data("FP32", '[1, {"a": [2]}]')])),
        "scalar_data": body(infer([data("INT32", "7")])),
        "deep_data": body(infer([data("FP32", "[" * 66 + "1" + "]" * 66)])),
        "unknown_datatype": body(infer([data("FP16", '["x", {}]')])),
        "two_data": body(infer(['{"name": "x", "datatype": "FP32", "data": [1], "data": ["a"], '
                                '"shape": [1]}'])),
        "binary": body(infer([binary(8)], outputs), struct.pack("<2f", 1, 2)),
        "binary_and_json": body(infer([data("FP32", "[1, 2]"), binary(8), data("INT64", "[3]")]),
                                struct.pack("<2f", 3, 4)),
        "binary_short": body(infer([binary(16)]), b"\0" * 4),
        "binary_left_over": body(infer([binary(4)]), b"\0" * 12),
        "binary_and_data": body(infer(['{"name": "x", "datatype": "FP32", "shape": [1], "data": '
                                       '[1], "parameters": {"binary_data_size": 4}}']), b"\0" * 4),
        "params": body(infer([data("FP32", "[1]")], '"parameters": {"binary_data_output": true, '
                             '"a": 1, "b": -1.5, "c": "s", "d": 18446744073709551615}, ')),
        "shm_input": body(infer(['{"name": "x", "datatype": "FP32", "shape": [2], "parameters": '
                                 '{"shared_memory_region": "r", "shared_memory_byte_size": 8}}'])),
        "inputs_twice": body('{"inputs": [%s], "inputs": 3}' % data("FP32", "[1, 2]")),
        "inputs_nested": body('{"a": {"inputs": [%s]}, "inputs": [%s]}' %
                              (data("FP32", '["a"]'), data("FP32", "[1, 2]"))),
        "not_json": body('{"inputs": [%s' % data("FP32", "[1, 2")),
        "nul_after": body(infer([data("FP32", "[1]")]) + "\0garbage"),
        "not_object": body("[1, 2]"),
        "empty": b"\0\0",
        "byte_order_mark": body("\ufeff" + infer([data("FP32", "[1]")])),
        # Found by the fuzzer: a Document's parse drops a leading 0xEF, 0xBB and 0xBF each on its
        # own, and counts error offsets from the first byte.
        "part_of_a_byte_order_mark": struct.pack("<H", 20) + b"\xef" * 20,
        "mark_bytes_then_json": body(b"\xbb\xbf" + infer([data("FP32", "[1]")]).encode()),
    }


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, data in seeds.items():
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("%s: %d seeds, %d bytes" % (target, len(seeds), sum(len(v) for v in seeds.values())))


if __name__ == "__main__":
    write("fuzz_execute_plan", execute_plan_seeds())
    write("fuzz_put_assembly", put_assembly_seeds())
    write("fuzz_npy", npy_seeds())
    write("fuzz_graph_json", graph_json_seeds())
    write("fuzz_model_infer_parse", {**model_infer_parse_seeds(), **execute_lift_seeds()})
    write("fuzz_http_infer", http_infer_seeds())
