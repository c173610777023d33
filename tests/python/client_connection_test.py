"""The Python client's connections: the default deadline, retries, sessions.

Against a real server where it can show the effect (a queue full under --max_inflight=2), and
where opserve cannot show what it received or fail on cue, against a small gRPC server here
(RecordingServer) that records each call's metadata and deadline, over real gRPC.
"""

import asyncio
import socket
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

RNG = np.random.default_rng(3912)

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

if __name__ == "__main__":
    unittest.main()
