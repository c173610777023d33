"""opserve.Graph: what it builds (no server), and every op on every dtype the server lists,
from stored and inline inputs, checked against the op table's CPU reference (op_table.py) on a
real CPU server."""

import unittest

import grpc
import numpy as np

import op_table
import opserve
from client_support import ServerTestCase

RNG = np.random.default_rng(1616)
F32, I32, I64, BF16 = (opserve.DType.FLOAT32, opserve.DType.INT32, opserve.DType.INT64,
                       opserve.DType.BFLOAT16)


class GraphBuilderTest(unittest.TestCase):
    def test_the_issue_example_compiles_to_its_request(self):
        b = np.ones((48, 32), np.float32)
        g = opserve.Graph()
        ab = g.matmul(g.stored("A"), g.input("B", b), algorithm="cublas")
        g.output(g.row_mean(g.transpose(ab)), name="mean", store_as="MEAN")
        r = g.to_request()
        self.assertEqual([(n.id, n.op, n.algorithm) for n in r.nodes],
                         [("matmul_0", "matmul", "cublas"), ("transpose_1", "transpose", ""),
                          ("mean", "row_mean", "")])
        self.assertEqual([i.WhichOneof("source") for i in r.nodes[0].inputs],
                         ["stored", "inline_name"])
        self.assertEqual(r.nodes[1].inputs[0].node, "matmul_0")
        self.assertEqual(r.nodes[2].inputs[0].node, "transpose_1")
        self.assertEqual(list(r.inline_tensors["B"].shape), [48, 32])
        self.assertEqual(r.inline_tensors["B"].data, b.tobytes())
        self.assertEqual(len(r.outputs), 1)
        out = r.outputs[0]
        self.assertEqual((out.node, out.return_inline, out.store_as, out.overwrite),
                         ("mean", True, "MEAN", False))

    def test_every_op_is_a_method(self):
        # The builder keeps no op list: any name is an op's method (the server judges it).
        g = opserve.Graph()
        node = g.an_op_of_a_newer_server(g.stored("x"), g.stored("y"), algorithm="auto", id="n")
        self.assertEqual((node.op, node.name, node.algorithm, len(node.inputs)),
                         ("an_op_of_a_newer_server", "n", "auto", 2))
        self.assertEqual(g.to_request().nodes[0].op, "an_op_of_a_newer_server")
        with self.assertRaises(AttributeError):
            g._not_an_op  # noqa: B018 - private names stay attributes

    def test_attrs_keep_their_types(self):
        g = opserve.Graph()
        g.op("sum", g.stored("x"), id="s", flag=True, count=3, scale=0.5, mode="fast")
        attrs = g.to_request().nodes[0].attrs
        self.assertEqual({k: v.WhichOneof("value") for k, v in attrs.items()},
                         {"flag": "b", "count": "i", "scale": "f", "mode": "s"})
        self.assertEqual((attrs["flag"].b, attrs["count"].i, attrs["scale"].f, attrs["mode"].s),
                         (True, 3, 0.5, "fast"))
        with self.assertRaises(TypeError):
            g.sum(g.stored("x"), bad=[1, 2])

    def test_outputs_stored_only_and_explicit_ids(self):
        g = opserve.Graph()
        t = g.transpose(g.stored("x"), id="t")
        g.output(t, store_as="T", overwrite=True, return_inline=False)
        out = g.to_request().outputs[0]
        self.assertEqual((out.node, out.return_inline, out.store_as, out.overwrite),
                         ("t", False, "T", True))

    def test_misuse_is_refused_where_it_happens(self):
        g, other = opserve.Graph(), opserve.Graph()
        x = g.stored("x")
        with self.assertRaises(TypeError):
            g.sum("x")
        with self.assertRaises(ValueError):
            g.sum(other.stored("x"))
        with self.assertRaises(ValueError):
            g.output(g.sum(x), return_inline=False)  # neither returned nor stored
        named = g.row_sum(x, id="rows")
        with self.assertRaises(ValueError):
            g.output(named, name="other")  # it has an id already
        g.input("in", np.zeros(2, np.int32))
        with self.assertRaises(ValueError):
            g.input("in", np.zeros(2, np.int32))
        g.transpose(x, id="rows")
        with self.assertRaises(ValueError):
            g.to_request()  # two nodes with one id
        with self.assertRaises(opserve.OpserveError):
            g.input("f64", np.zeros(2))  # float64 needs a dtype named


def bfloat16_values(shape):
    """float32 values exactly representable in bfloat16, so the reference sees what was sent."""
    bits = opserve.float32_to_bfloat16_bits(RNG.standard_normal(shape))
    return opserve.bfloat16_bits_to_float32(bits)


def inputs_for(model, dtype):
    """Fresh random arrays of `dtype` on the op's last (largest) small case: (the arrays to
    upload, the bytes the server reads)."""
    arrays = []
    for shape in model.small_shapes[-1]:
        if dtype == I32:
            arrays.append(RNG.integers(-(1 << 31), 1 << 31, shape, dtype=np.int32))
        elif dtype == I64:
            arrays.append(RNG.integers(-(1 << 40), 1 << 40, shape, dtype=np.int64))
        elif dtype == BF16:
            arrays.append(bfloat16_values(shape))
        else:
            arrays.append(RNG.standard_normal(shape).astype(np.float32))
    wire = [(opserve.float32_to_bfloat16_bits(a) if dtype == BF16 else a).tobytes() for a in arrays]
    return arrays, wire


class GraphRunTest(ServerTestCase):
    def setUp(self):
        self.client = opserve.Client(self.server.target, timeout=60)
        self.addCleanup(self.client.close)
        self.addCleanup(self.delete_all)

    def delete_all(self):
        for info in self.client.list():
            self.client.delete(info.name)

    def test_every_op_on_every_dtype_from_stored_and_inline_inputs(self):
        table = op_table.shared()
        ops = self.client.ops().ops
        self.assertEqual({op.name for op in ops}, table.names("cpu"), "ListOps against the op table")
        for op in ops:
            for dtype in op.dtypes:
                with self.subTest(op=op.name, dtype=dtype.value):
                    arrays, wire = inputs_for(table.op(op.name), dtype)
                    g = opserve.Graph()
                    stored, inline = [], []
                    for i, a in enumerate(arrays):
                        self.client.put(f"in{i}", a, dtype=dtype, overwrite=True)
                        stored.append(g.stored(f"in{i}"))
                        inline.append(g.input(f"inline{i}", a, dtype=dtype))
                    g.output(g.op(op.name, *stored), name="from_stored")
                    g.output(g.op(op.name, *inline, algorithm=op.default_algorithm),
                             name="from_inline")
                    result = self.client.run(g, raw_bfloat16=True)  # outputs as their wire bytes
                    nodes = {n.id: n for n in result.nodes}
                    for name in ("from_stored", "from_inline"):
                        node = nodes[name]
                        ok, message = table.check(
                            op.name, node.algorithm,
                            [(str(dtype), a.shape, w) for a, w in zip(arrays, wire)],
                            (str(node.dtype), node.shape, np.ascontiguousarray(result[name]).tobytes()))
                        self.assertTrue(ok, f"{name}: {message}")
                    self.assertEqual({n.algorithm for n in result.nodes}, {op.default_algorithm})

    def test_the_issue_example(self):
        a = RNG.standard_normal((64, 48)).astype(np.float32)
        b = RNG.standard_normal((48, 32)).astype(np.float32)
        self.client.put("A", a)
        g = opserve.Graph()
        ab = g.matmul(g.stored("A"), g.input("B", b), algorithm="auto")
        g.output(g.row_mean(g.transpose(ab)), name="mean", store_as="MEAN")
        result = self.client.run(g)

        want = (a.astype(np.float64) @ b.astype(np.float64)).mean(axis=0)
        np.testing.assert_allclose(result["mean"], want, rtol=1e-4, atol=1e-5)
        self.assertEqual(list(result.outputs), ["mean"])
        self.assertEqual([(s.name, s.shape) for s in result.stored], [("MEAN", (32,))])
        np.testing.assert_array_equal(self.client.get("MEAN"), result["mean"])

        self.assertEqual([(n.id, n.op, n.dtype, n.shape) for n in result.nodes],
                         [("matmul_0", "matmul", F32, (64, 32)),
                          ("transpose_1", "transpose", F32, (32, 64)), ("mean", "row_mean", F32, (32,))])
        for n in result.nodes:
            self.assertNotIn(n.algorithm, ("", "auto"))
            self.assertGreater(n.bytes, 0)
            self.assertGreaterEqual(n.kernel_us, 0)
            self.assertGreaterEqual(n.gbps, 0)
        self.assertEqual(result.nodes[0].flops, 2 * 64 * 48 * 32)
        self.assertGreater(result.timing.total_us, 0)
        self.assertEqual(result.device, "cpu")
        self.assertEqual(result.graph, "GRAPH_NOT_USED")  # the CPU runs node by node

        lines = result.table().splitlines()
        self.assertEqual(lines[0].split(), ["node", "op", "algorithm", "shape", "kernel_us",
                                            "bytes", "GB/s", "GFLOP/s", "fused", "into"])
        self.assertEqual([line.split()[0] for line in lines[1:5]],
                         ["matmul_0", "transpose_1", "mean", "total"])
        self.assertIn("float32[64, 32]", lines[1])
        self.assertTrue(lines[-1].startswith("device cpu: queue"))

    def test_store_as_and_overwrite(self):
        self.client.put("x", np.arange(12, dtype=np.int32).reshape(3, 4))

        def transpose_into_t(overwrite):
            g = opserve.Graph()
            g.output(g.transpose(g.stored("x")), store_as="T", overwrite=overwrite, return_inline=False)
            return self.client.run(g)

        result = transpose_into_t(False)
        self.assertEqual(result.outputs, {})
        self.assertEqual([(s.name, s.dtype, s.shape) for s in result.stored], [("T", I32, (4, 3))])
        np.testing.assert_array_equal(self.client.get("T"), np.arange(12).reshape(3, 4).T)
        with self.assertRaises(opserve.OpserveError) as caught:
            transpose_into_t(False)
        self.assertEqual(caught.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("'T'", caught.exception.message)
        transpose_into_t(True)

    def test_bfloat16_outputs_widened_or_raw(self):
        x = bfloat16_values((5, 3))
        g = opserve.Graph()
        g.output(g.transpose(g.input("x", x, dtype="bfloat16")), name="t")
        widened = self.client.run(g)["t"]
        self.assertEqual(widened.dtype, np.float32)
        np.testing.assert_array_equal(widened, x.T)
        raw = self.client.run(g, raw_bfloat16=True)["t"]
        self.assertEqual(raw.dtype, np.uint16)
        np.testing.assert_array_equal(raw, opserve.float32_to_bfloat16_bits(x.T))

    def test_errors_carry_code_and_message(self):
        self.client.put("m", np.zeros((4, 5), np.float32))
        cases = [
            (grpc.StatusCode.NOT_FOUND, "'nothing'", lambda g: g.sum(g.stored("nothing"))),
            (grpc.StatusCode.INVALID_ARGUMENT, "inner dimensions",
             lambda g: g.matmul(g.stored("m"), g.stored("m"))),
            (grpc.StatusCode.INVALID_ARGUMENT, "unknown attribute 'axis'",
             lambda g: g.transpose(g.stored("m"), axis=1)),
            (grpc.StatusCode.INVALID_ARGUMENT, "unknown op 'softmax'",
             lambda g: g.op("softmax", g.stored("m"))),
            (grpc.StatusCode.INVALID_ARGUMENT, "'no_such_kernel'",
             lambda g: g.sum(g.stored("m"), algorithm="no_such_kernel")),
        ]
        for code, message, build in cases:
            with self.subTest(message=message):
                g = opserve.Graph()
                g.output(build(g))
                with self.assertRaises(opserve.OpserveError) as caught:
                    self.client.run(g)
                self.assertEqual(caught.exception.code, code, caught.exception.message)
                self.assertIn(message, caught.exception.message)


if __name__ == "__main__":
    unittest.main()
