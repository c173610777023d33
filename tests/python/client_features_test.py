"""The Python client's parity with the server, against real servers: fused nodes and the table
opserve-cli prints, saved graphs, shared memory, cast=, the default deadline, retries, sessions.

Sessions and UNAVAILABLE retries need a server that shows what it received or fails on cue, which
opserve does not: a small gRPC server here (RecordingServer) answers and records the metadata of
every call it gets, over real gRPC.
"""

import asyncio
import contextlib
import os
import pydoc
import re
import socket
import subprocess
import threading
import time
import unittest
from concurrent import futures

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


def silent_listener():
    """A socket that accepts connections and never answers: (socket, "127.0.0.1:port")."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


class DeadlineTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.listener, self.target = silent_listener()

    def tearDown(self):
        self.listener.close()

    def test_a_silent_server_fails_a_unary_call_at_the_deadline(self):
        with opserve.Client(self.target, unary_timeout=1.5) as client:
            for call in (client.health, client.ops, client.list, client.graphs):
                start = time.monotonic()
                with self.assertRaises(opserve.OpserveError) as caught:
                    call()
                self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
                self.assertLess(time.monotonic() - start, 10, call.__name__)

    def test_the_default_deadline_is_30_seconds(self):
        # A gRPC server that takes the call and never answers: without a deadline, a wait
        # without end.
        server = RecordingServer(hang=True)
        try:
            with opserve.Client(server.target) as client:
                start = time.monotonic()
                with self.assertRaises(opserve.OpserveError) as caught:
                    client.health()
                waited = time.monotonic() - start
        finally:
            server.stop()
        self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertGreater(waited, 29)
        self.assertLess(waited, 45)

    async def test_asyncio_too(self):
        async with opserve.aio.Client(self.target, unary_timeout=1.0) as client:
            with self.assertRaises(opserve.OpserveError) as caught:
                await client.health()
        self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)


class RetryUnderLoadTest(ServerTestCase, unittest.IsolatedAsyncioTestCase):
    server_args = ("--max_inflight=2",)

    async def gather_runs(self, client):
        a = RNG.standard_normal((128, 128)).astype(np.float32)
        g = opserve.Graph()
        g.output(g.matmul(g.input("A", a), g.input("B", a)), name="ab")
        results = await asyncio.gather(*(client.run(g) for _ in range(100)),
                                       return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]

    async def test_100_concurrent_runs_succeed_with_retry_and_some_fail_without(self):
        async with opserve.aio.Client(self.server.target, retry=False) as client:
            failures = await self.gather_runs(client)
        self.assertGreater(len(failures), 0, "the queue never filled: the test proves nothing")
        self.assertEqual({f.code for f in failures}, {grpc.StatusCode.RESOURCE_EXHAUSTED})
        async with opserve.aio.Client(self.server.target) as client:
            self.assertEqual(await self.gather_runs(client), [])

    async def test_a_graph_that_stores_without_overwrite_is_not_retried(self):
        # Run twice, it would answer ALREADY_EXISTS for what its first try stored.
        async with opserve.aio.Client(self.server.target) as client:
            g = opserve.Graph()
            big = RNG.standard_normal((128, 128)).astype(np.float32)
            stores = []
            for i in range(60):
                g = opserve.Graph()
                g.output(g.matmul(g.input("A", big), g.input("B", big)), store_as=f"kept{i}",
                         return_inline=False)
                stores.append(client.run(g))
            results = await asyncio.gather(*stores, return_exceptions=True)
            codes = {r.code for r in results if isinstance(r, opserve.OpserveError)}
            self.assertEqual(codes, {grpc.StatusCode.RESOURCE_EXHAUSTED})
            for info in await client.list():
                await client.delete(info.name)


class RecordingServer:
    """A real gRPC server for opserve's and the health methods that records each call's method
    and metadata, and answers the first `failures` calls with UNAVAILABLE; with hang, it
    answers no call until stopped."""

    _STREAMS = {"/opserve.v1.OpServe/PutTensor": "stream_unary",
                "/opserve.v1.OpServe/GetTensor": "unary_stream"}

    def __init__(self, failures=0, hang=False):
        self.calls = []
        self.deadlines = {}  # method name: seconds left when the call arrived (None: no deadline)
        self.failures = failures
        self.hang = hang
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers((self,))
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self):
        self.released.set()
        self.server.stop(None)

    def service(self, details):
        method = details.method
        kind = self._STREAMS.get(method, "unary_unary")

        def answer(context):
            with self.lock:
                self.calls.append((method, dict(context.invocation_metadata())))
                left = context.time_remaining()
                # gRPC Python tells "no deadline" as None or as about 2^63 seconds.
                no_deadline = left is None or left > 1e9
                self.deadlines[method.rsplit("/", 1)[1]] = None if no_deadline else left
                fail = len(self.calls) <= self.failures
            if self.hang:
                self.released.wait()
            if fail:
                context.abort(grpc.StatusCode.UNAVAILABLE, "failing on cue")
            if method.endswith("/Check"):
                return pb.HealthCheckResponse(status=1).SerializeToString()
            info = pb.TensorInfo(name="x", dtype=1, shape=[0])
            if method.endswith("/PutTensor"):
                return pb.PutTensorResponse(info=info).SerializeToString()
            if method.endswith("/DeleteTensor"):
                return pb.DeleteTensorResponse(info=info).SerializeToString()
            return b""  # every other response: its empty message

        if kind == "stream_unary":
            def handler(requests, context):
                for _ in requests:
                    pass
                return answer(context)
            return grpc.stream_unary_rpc_method_handler(handler)
        if kind == "unary_stream":
            def handler(request, context):
                answer(context)
                yield pb.GetTensorResponse(info=pb.TensorInfo(name="x", dtype=1, shape=[0]))\
                    .SerializeToString()
            return grpc.unary_stream_rpc_method_handler(handler)
        return grpc.unary_unary_rpc_method_handler(lambda request, context: answer(context))


class SessionTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.server = RecordingServer()

    def tearDown(self):
        self.server.stop()

    def sessions(self):
        return [metadata.get("x-opserve-session") for _, metadata in self.server.calls]

    def every_call(self, client):
        client.health()
        client.ops()
        client.list()
        client.put("x", np.zeros((0,), np.float32))
        client.get("x")
        client.run(opserve.Graph())
        client.graphs()
        client.delete("x")

    def test_the_session_id_goes_with_every_call(self):
        with opserve.Client(self.server.target, session="user-17") as client:
            self.every_call(client)
        self.assertEqual(len(self.server.calls), 8)
        self.assertEqual(set(self.sessions()), {"user-17"})

    def test_session_true_draws_one_id_per_client(self):
        with opserve.Client(self.server.target, session=True) as first, \
                opserve.Client(self.server.target, session=True) as second:
            first.health()
            first.list()
            second.health()
        ids = self.sessions()
        self.assertRegex(first.session, r"^[0-9a-f]{32}$")
        self.assertEqual(ids, [first.session, first.session, second.session])
        self.assertNotEqual(first.session, second.session)

    def test_unary_calls_that_run_no_graph_have_the_default_deadline_and_the_others_none(self):
        with opserve.Client(self.server.target) as client:
            self.every_call(client)
        deadlines = self.server.deadlines
        for method in ("Check", "ListOps", "ListTensors", "ListGraphs", "DeleteTensor"):
            self.assertTrue(25 < deadlines[method] < 31, f"{method}: {deadlines[method]}")
        for method in ("PutTensor", "GetTensor", "Execute"):
            self.assertIsNone(deadlines[method], method)
        self.server.deadlines.clear()
        with opserve.Client(self.server.target, timeout=7, unary_timeout=None) as client:
            self.every_call(client)
            client.health(timeout=3)
        self.assertTrue(5 < deadlines["Execute"] < 8)
        self.assertTrue(1 < deadlines["Check"] < 4)
        self.server.deadlines.clear()
        with opserve.Client(self.server.target, unary_timeout=None) as client:
            self.every_call(client)
        self.assertEqual(set(deadlines.values()), {None})

    def test_no_session_no_header(self):
        with opserve.Client(self.server.target) as client:
            client.health()
        self.assertEqual(self.sessions(), [None])

    async def test_asyncio_sends_it_too(self):
        async with opserve.aio.Client(self.server.target, session="s-2") as client:
            await client.health()
            await client.put("x", np.zeros((0,), np.float32))
            await client.get("x")
            await client.run(opserve.Graph())
        self.assertEqual(self.sessions(), ["s-2"] * 4)


class RetryUnavailableTest(unittest.IsolatedAsyncioTestCase):
    def tearDown(self):
        self.server.stop()

    def test_safe_calls_are_retried_and_unsafe_ones_are_not(self):
        self.server = RecordingServer(failures=2)
        with opserve.Client(self.server.target) as client:
            self.assertTrue(client.health())
        self.assertEqual(len(self.server.calls), 3)
        self.server.failures = 4
        with opserve.Client(self.server.target) as client:
            with self.assertRaises(opserve.OpserveError) as caught:
                client.delete("x")  # a second try would answer NOT_FOUND for the first's work
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(len(self.server.calls), 4)

    def test_opting_out_and_a_policy_of_ones_own(self):
        self.server = RecordingServer(failures=3)
        with opserve.Client(self.server.target, retry=False) as client:
            with self.assertRaises(opserve.OpserveError):
                client.health()
        self.assertEqual(len(self.server.calls), 1)
        with opserve.Client(self.server.target, retry=opserve.Retry(attempts=2)) as client:
            with self.assertRaises(opserve.OpserveError):
                client.health()
        self.assertEqual(len(self.server.calls), 3)
        with opserve.Client(self.server.target, retry=opserve.Retry(attempts=2)) as client:
            self.assertTrue(client.health())

    async def test_asyncio_retries_a_put_with_overwrite(self):
        self.server = RecordingServer(failures=3)
        async with opserve.aio.Client(self.server.target) as client:
            await client.put("x", np.zeros((0,), np.float32), overwrite=True)
        self.assertEqual(len(self.server.calls), 4)


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

    # DType subclasses str (opserve/dtypes.py), so pydoc lists str's ~45 methods, 458 lines,
    # under it. The decorator goes with that: then this passes, and an unexpected success fails
    # the suite until it is removed.
    @unittest.expectedFailure
    def test_help_is_the_client_not_str(self):
        text = pydoc.render_doc(opserve, renderer=pydoc.plaintext)
        for str_method in ("casefold", "zfill", "maketrans", "isidentifier"):
            self.assertNotIn(str_method, text)
        self.assertLess(len(text.splitlines()), 1100)


if __name__ == "__main__":
    unittest.main()
