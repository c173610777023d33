"""Client.stream and stream_saved, sync and asyncio, against a real CPU server: many graphs on one
stream answered by id and checked against numpy, a failing request among them answered alone,
op models over ModelStreamInfer, and a stream the consumer leaves early."""

import asyncio
import unittest

import grpc
import numpy as np

import opserve
import opserve.aio
from client_support import ClientTestCase, ServerTestCase

RNG = np.random.default_rng(2718)


def row_mean_graph(x):
    g = opserve.Graph()
    g.output(g.row_mean(g.input("x", x)), name="m")
    return g


def inputs(n):
    return {str(i): RNG.standard_normal((1 + i % 5, 3 + i)).astype(np.float32) for i in range(n)}


class StreamTest(ClientTestCase):
    server_args = ("--stream_window=4",)

    def test_graphs_answered_each_by_its_id(self):
        xs = inputs(40)
        got = {}
        for r in self.client.stream((i, row_mean_graph(x)) for i, x in xs.items()):
            self.assertTrue(r.ok, r.error)
            self.assertNotIn(r.id, got)
            got[r.id] = r.value()["m"]
        self.assertEqual(set(got), set(xs))
        for i, x in xs.items():
            np.testing.assert_allclose(got[i], x.mean(axis=1), rtol=1e-5, atol=1e-6)

    def test_graphs_without_ids_are_numbered(self):
        xs = list(inputs(5).values())
        got = {r.id: r.value()["m"] for r in self.client.stream(row_mean_graph(x) for x in xs)}
        self.assertEqual(set(got), {"0", "1", "2", "3", "4"})
        np.testing.assert_allclose(got["3"], xs[3].mean(axis=1), rtol=1e-5, atol=1e-6)

    def test_a_failing_request_is_answered_alone(self):
        x = RNG.standard_normal((2, 6)).astype(np.float32)
        bad = opserve.Graph()
        bad.output(bad.matmul(bad.input("x", x), bad.input("y", x)), name="m")  # 6 != 2
        results = {r.id: r for r in self.client.stream(
            [("a", row_mean_graph(x)), ("bad", bad), ("b", row_mean_graph(x))])}
        self.assertEqual(set(results), {"a", "bad", "b"})
        np.testing.assert_allclose(results["b"].value()["m"], x.mean(axis=1), rtol=1e-5)
        err = results["bad"].error
        self.assertIsInstance(err, opserve.OpserveError)
        self.assertEqual(err.code, grpc.StatusCode.INVALID_ARGUMENT, err.message)
        self.assertIn("matmul", err.message)
        with self.assertRaises(opserve.OpserveError):
            results["bad"].value()

    def test_op_models_over_model_stream_infer(self):
        xs = inputs(12)
        requests = [(i, "row_sum", {"x": x}) for i, x in xs.items()]
        requests.insert(5, ("missing", "no_such_model", {"x": xs["0"]}))
        got = {r.id: r for r in self.client.stream_saved(requests)}
        self.assertEqual(set(got), set(xs) | {"missing"})
        for i, x in xs.items():
            np.testing.assert_allclose(got[i].value().outputs["y"], x.sum(axis=1), rtol=1e-5,
                                       atol=1e-5)
        self.assertFalse(got["missing"].ok)
        self.assertIn("no_such_model", got["missing"].error.message)

    def test_leaving_early_cancels_the_stream(self):
        x = RNG.standard_normal((4, 4)).astype(np.float32)
        results = self.client.stream(row_mean_graph(x) for _ in range(1000))
        first = next(results)
        self.assertTrue(first.ok)
        results.close()  # cancels the call; the client and the server go on
        self.assertEqual(len(list(self.client.stream([row_mean_graph(x)]))), 1)

    def test_an_item_that_is_not_a_graph_raises_after_the_stream(self):
        x = RNG.standard_normal((2, 2)).astype(np.float32)
        with self.assertRaises(TypeError):
            list(self.client.stream([row_mean_graph(x), "not a graph"]))


class AioStreamTest(ServerTestCase, unittest.IsolatedAsyncioTestCase):
    server_args = ("--stream_window=4",)

    async def asyncSetUp(self):
        self.client = opserve.aio.Client(self.server.target, timeout=30)

    async def asyncTearDown(self):
        await self.client.close()

    async def test_graphs_from_an_async_iterable(self):
        xs = inputs(30)

        async def graphs():
            for i, x in xs.items():
                if i == "7":
                    g = opserve.Graph()
                    g.output(g.row_mean(g.stored("no_such_tensor")), name="m")
                    yield i, g
                else:
                    yield i, row_mean_graph(x)
                await asyncio.sleep(0)

        got = {}
        async for r in self.client.stream(graphs()):
            got[r.id] = r
        self.assertEqual(set(got), set(xs))
        self.assertEqual(got["7"].error.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("no_such_tensor", got["7"].error.message)
        for i, x in xs.items():
            if i != "7":
                np.testing.assert_allclose(got[i].value()["m"], x.mean(axis=1), rtol=1e-5,
                                           atol=1e-6)

    async def test_op_models_and_two_streams_at_once(self):
        xs = inputs(10)

        async def collect(stream):
            return {r.id: r async for r in stream}

        a, b = await asyncio.gather(
            collect(self.client.stream_saved([(i, "row_sum", {"x": x}) for i, x in xs.items()])),
            collect(self.client.stream([(i, row_mean_graph(x)) for i, x in xs.items()])))
        for i, x in xs.items():
            np.testing.assert_allclose(a[i].value().outputs["y"], x.sum(axis=1), rtol=1e-5,
                                       atol=1e-5)
            np.testing.assert_allclose(b[i].value()["m"], x.mean(axis=1), rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    unittest.main()
