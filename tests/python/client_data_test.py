"""The Python client's results and data against a real CPU server: fused nodes and the table
opserve-cli prints, saved graphs, shared memory, cast=, and what help(opserve) shows."""

import contextlib
import os
import pydoc
import re
import subprocess
import unittest

import grpc
import numpy as np

import opserve
import opserve.aio
from client_support import ServerTestCase
from opserve._proto import pb

RNG = np.random.default_rng(3911)


def fused_graph(a, b):
    """matmul, then transpose and row_mean: the server runs the last two as one column mean."""
    g = opserve.Graph()
    ab = g.matmul(g.input("A", a), g.input("B", b), id="ab")
    g.output(g.row_mean(g.transpose(ab, id="ab_t")), name="mean")
    return g


def cells(line):
    """A table line's cells: columns are two spaces apart or more, and a cell holds at most one
    space in a row ("fused into", "float32[16, 4]")."""
    return re.split(r"\s{2,}", line.strip())


def header_columns(table):
    return cells(next(line for line in table.splitlines() if line.startswith("node ")))


class FusionAndTableTest(ServerTestCase):
    def test_fused_into_and_a_total_that_counts_the_fused_kernel_once(self):
        a = RNG.standard_normal((64, 48)).astype(np.float32)
        b = RNG.standard_normal((48, 32)).astype(np.float32)
        with opserve.Client(self.server.target) as client:
            result = client.run(fused_graph(a, b))
        nodes = {n.id: n for n in result.nodes}
        self.assertEqual(nodes["ab_t"].fused_into, "mean")
        self.assertEqual(nodes["mean"].fused_into, "")
        self.assertEqual(nodes["ab"].fused_into, "")
        self.assertEqual(nodes["ab_t"].kernel_us, nodes["mean"].kernel_us)
        self.assertEqual(result.kernel_us, nodes["ab"].kernel_us + nodes["mean"].kernel_us)
        self.assertEqual(result.batch_size, 1)
        t = result.timing
        self.assertGreater(t.total_us, 0)
        self.assertGreaterEqual(t.total_us, t.compute_us)

        table = result.table()
        self.assertEqual(header_columns(table)[-1], "fused into")
        rows = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}
        self.assertEqual(rows["ab_t"][-1], "mean")
        self.assertEqual(rows["total"][1], f"{result.kernel_us:.1f}")
        self.assertEqual(int(rows["total"][2]), nodes["ab"].bytes + nodes["mean"].bytes)

    def test_no_fused_into_column_when_nothing_fused(self):
        with opserve.Client(self.server.target) as client:
            g = opserve.Graph()
            g.output(g.transpose(g.input("X", np.ones((3, 5), np.float32)), fuse=False))
            result = client.run(g)
        self.assertNotIn("fused into", header_columns(result.table()))

    def test_same_columns_as_opserve_cli_run(self):
        cli = os.environ.get("OPSERVE_CLI")
        if not cli:
            self.fail("OPSERVE_CLI is not set (ctest sets it to the opserve-cli binary)")
        a = RNG.standard_normal((16, 8)).astype(np.float32)
        b = RNG.standard_normal((8, 4)).astype(np.float32)
        np.save(os.path.join(self.work_dir, "a.npy"), a)
        np.save(os.path.join(self.work_dir, "b.npy"), b)
        graph = os.path.join(self.work_dir, "graph.json")
        with open(graph, "w") as f:
            f.write('{"nodes": [{"id": "ab", "op": "matmul", "inputs": [{"inlineName": "A"}, '
                    '{"inlineName": "B"}]}, {"id": "ab_t", "op": "transpose", "inputs": '
                    '[{"node": "ab"}]}, {"id": "mean", "op": "row_mean", "inputs": [{"node": '
                    '"ab_t"}]}], "inlineTensors": {"A": {"npy": "a.npy"}, "B": {"npy": "b.npy"}},'
                    ' "outputs": [{"node": "mean", "returnInline": true}]}')
        run = subprocess.run([cli, "--target", self.server.target, "run", graph],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        with opserve.Client(self.server.target) as client:
            table = client.run(fused_graph(a, b)).table()
        self.assertEqual(header_columns(table), header_columns(run.stdout))
        cli_rows = {cells(line)[0]: cells(line) for line in run.stdout.splitlines()
                    if line.split()[:1] in (["ab"], ["ab_t"], ["mean"])}
        rows = {cells(line)[0]: cells(line) for line in table.splitlines() if line.strip()}
        self.assertEqual(sorted(cli_rows), ["ab", "ab_t", "mean"])
        for node, cli_cells in cli_rows.items():
            # node, op, algorithm, shape and "fused into" agree; the timings are two runs'.
            self.assertEqual(rows[node][:4] + rows[node][8:], cli_cells[:4] + cli_cells[8:], node)


class SavedGraphTest(ServerTestCase):
    def saved_graph(self):
        g = opserve.Graph()
        ab = g.matmul(g.input("A", dtype="float32", shape=(-1, 48)),
                      g.input("B", dtype=opserve.DType.FLOAT32, shape=(48, -1)), id="ab")
        g.output(g.row_mean(g.transpose(ab, id="ab_t")), name="mean")
        return g

    def test_save_list_run_by_name_delete(self):
        a = RNG.standard_normal((20, 48)).astype(np.float32)
        b = RNG.standard_normal((48, 12))  # float64: cast=True
        with opserve.Client(self.server.target) as client:
            info = client.save_graph("col_means", self.saved_graph())
            self.assertEqual(info.name, "col_means")
            self.assertEqual(info.nodes, 3)
            self.assertEqual(sorted((t.name, t.shape) for t in info.inputs),
                             [("A", (-1, 48)), ("B", (48, -1))])
            self.assertEqual([t.name for t in info.outputs], ["mean"])
            self.assertEqual([g.name for g in client.graphs()], ["col_means"])

            with self.assertRaises(opserve.OpserveError) as caught:
                client.save_graph("col_means", self.saved_graph())
            self.assertEqual(caught.exception.code, grpc.StatusCode.ALREADY_EXISTS)
            client.save_graph("col_means", self.saved_graph(), overwrite=True)

            result = client.run_saved("col_means", {"A": a, "B": b}, cast=True)
            want = (a.astype(np.float64) @ b.astype(np.float32).astype(np.float64)).mean(axis=0)
            np.testing.assert_allclose(result["mean"], want, rtol=1e-4, atol=1e-5)
            self.assertEqual(result.parameters["ab_t.fused_into"], "mean")
            self.assertAlmostEqual(result.kernel_us, result.parameters["ab.kernel_us"]
                                   + result.parameters["mean.kernel_us"], delta=1e-3)
            with self.assertRaises(opserve.OpserveError) as caught:
                client.run_saved("col_means", {"A": a, "B": b})
            self.assertIn("float64", caught.exception.message)

            before = shm_objects()
            by_shm = client.run_saved("col_means", {"A": a, "B": b}, cast=True, shm=True)
            np.testing.assert_array_equal(by_shm["mean"], result["mean"])
            self.assertEqual(shm_objects(), before)

            self.assertEqual(client.delete_graph("col_means").name, "col_means")
            self.assertEqual(client.graphs(), [])
            with self.assertRaises(opserve.OpserveError) as caught:
                client.run_saved("col_means", {"A": a, "B": b}, cast=True)
            self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_a_declared_input_needs_dtype_and_shape(self):
        with self.assertRaises(ValueError):
            opserve.Graph().input("A", shape=(2, 2))


def shm_objects():
    return {n for n in os.listdir("/dev/shm") if n.startswith("opserve-py-")}


class SharedMemoryTest(ServerTestCase, unittest.IsolatedAsyncioTestCase):
    def regions(self):
        channel = grpc.insecure_channel(self.server.target)
        try:
            status = channel.unary_unary(
                "/inference.GRPCInferenceService/SystemSharedMemoryStatus",
                request_serializer=pb.SystemSharedMemoryStatusRequest.SerializeToString,
                response_deserializer=pb.SystemSharedMemoryStatusResponse.FromString)
            return dict(status(pb.SystemSharedMemoryStatusRequest(), timeout=10).regions)
        finally:
            channel.close()

    def test_put_get_run_through_shared_memory(self):
        before = shm_objects()
        a = RNG.standard_normal((300, 70)).astype(np.float32)
        b = RNG.standard_normal((70, 9)).astype(np.float32)
        with opserve.Client(self.server.target) as client:
            info = client.put("shm_a", a, shm=True)
            self.assertEqual((info.name, info.shape, info.bytes), ("shm_a", (300, 70), a.nbytes))
            np.testing.assert_array_equal(client.get("shm_a"), a)  # through the socket
            np.testing.assert_array_equal(client.get("shm_a", shm=True), a)
            client.put("shm_e", np.zeros((0, 3), np.int64), shm=True)
            self.assertEqual(client.get("shm_e", shm=True).shape, (0, 3))

            g = opserve.Graph()
            g.output(g.matmul(g.stored("shm_a"), g.input("B", b)), name="ab")
            np.testing.assert_allclose(client.run(g, shm=True)["ab"], a @ b, rtol=1e-4, atol=1e-4)
            with self.assertRaises(opserve.OpserveError) as caught:
                client.get("no_such", shm=True)
            self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
            client.delete("shm_a")
            client.delete("shm_e")
        # Every region unregistered and removed, the failed call's too.
        self.assertEqual(self.regions(), {})
        self.assertEqual(shm_objects(), before)

    async def test_asyncio_put_and_get_through_shared_memory(self):
        x = RNG.integers(-9, 9, (40, 33), dtype=np.int32)
        async with opserve.aio.Client(self.server.target) as client:
            await client.put("shm_x", x, shm=True)
            np.testing.assert_array_equal(await client.get("shm_x", shm=True), x)
            await client.delete("shm_x")
        self.assertEqual(self.regions(), {})

    def test_refused_for_a_server_on_another_host(self):
        # 192.0.2.0/24 is TEST-NET-1: never an address of this host. Refused before any call.
        with opserve.Client("192.0.2.1:50051", retry=False) as client:
            with self.assertRaises(opserve.OpserveError) as caught:
                client.put("x", np.ones(3, np.float32), shm=True)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("192.0.2.1:50051", caught.exception.message)


class CastTest(ServerTestCase):
    def test_other_dtypes_are_refused_by_name_without_cast(self):
        with opserve.Client(self.server.target) as client:
            for array in (np.ones(3), np.ones(3, np.float16), np.ones(3, np.uint8)):
                with self.assertRaises(opserve.OpserveError) as caught:
                    client.put("c", array)
                self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(str(array.dtype), caught.exception.message)
                self.assertIn("cast=True", caught.exception.message)
            with self.assertRaises(opserve.OpserveError):
                opserve.Graph().input("B", np.ones(3))
            self.assertEqual(client.list(), [])

    def test_cast_converts_to_the_nearest_dtype(self):
        cases = {"f64": (RNG.standard_normal((4, 5)), opserve.DType.FLOAT32, np.float32),
                 "f16": (np.arange(6, dtype=np.float16), opserve.DType.FLOAT32, np.float32),
                 "i8": (np.arange(-3, 3, dtype=np.int8), opserve.DType.INT32, np.int32),
                 "u16": (np.array([0, 65535], np.uint16), opserve.DType.INT32, np.int32),
                 "u32": (np.array([0, 2**32 - 1], np.uint32), opserve.DType.INT64, np.int64),
                 "bool": (np.array([True, False]), opserve.DType.INT32, np.int32)}
        with opserve.Client(self.server.target) as client:
            for name, (array, dtype, numpy_type) in cases.items():
                self.assertEqual(client.put(name, array, cast=True).dtype, dtype, name)
                got = client.get(name)
                self.assertEqual(got.dtype, numpy_type, name)
                np.testing.assert_array_equal(got, array.astype(numpy_type), err_msg=name)
                client.delete(name)
            with self.assertRaises(opserve.OpserveError) as caught:
                client.put("u64", np.array([2**63], np.uint64), cast=True)
            self.assertIn("INT64", caught.exception.message)
            g = opserve.Graph()
            g.output(g.sum(g.input("X", np.full(4, 0.5), cast=True)), name="s")
            self.assertEqual(float(client.run(g)["s"]), 2.0)


class HelpTest(ServerTestCase):
    def test_the_module_docstring_example_runs(self):
        doc = opserve.__doc__
        lines = doc[doc.index("    import numpy"):].split("\n\n")[0].splitlines()
        code = "\n".join(line[4:] for line in lines).replace("127.0.0.1:50051",
                                                             self.server.target)
        namespace = {}
        with open(os.devnull, "w") as devnull:
            with contextlib.redirect_stdout(devnull):
                exec(compile(code, "opserve.__doc__", "exec"), namespace)
        self.assertEqual(namespace["result"]["mean"].shape, (32,))
        with opserve.Client(self.server.target) as client:
            self.assertEqual(client.list(), [])  # the example cleans up after itself

    # DType is no str subclass (opserve/dtypes.py), so pydoc lists none of str's ~45 methods.
    # The bound is the package's own help (about 1330 lines with the device and stream types,
    # each frozen dataclass some 50) and less than str's 458 lines of methods would add to it.
    def test_help_is_the_client_not_str(self):
        text = pydoc.render_doc(opserve, renderer=pydoc.plaintext)
        for str_method in ("casefold", "zfill", "maketrans", "isidentifier"):
            self.assertNotIn(str_method, text)
        self.assertLess(len(text.splitlines()), 1400)

if __name__ == "__main__":
    unittest.main()
