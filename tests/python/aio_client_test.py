"""opserve.aio.Client against a real CPU server: every call, a graph, errors, and calls in
flight together on one channel (what asyncio is for)."""

import asyncio
import unittest

import grpc
import numpy as np

import opserve
import opserve.aio
from client_support import ServerTestCase

RNG = np.random.default_rng(1617)


class AioClientTest(ServerTestCase, unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        # Made here, inside the test's event loop: a grpc.aio channel belongs to one loop.
        self.client = opserve.aio.Client(self.server.target, timeout=30)

    async def asyncTearDown(self):
        for info in await self.client.list():
            await self.client.delete(info.name)
        await self.client.close()

    async def assertError(self, code, coroutine, text):
        with self.assertRaises(opserve.OpserveError) as caught:
            await coroutine
        self.assertEqual(caught.exception.code, code, caught.exception.message)
        self.assertIn(text, caught.exception.message)

    async def test_health_and_ops(self):
        self.assertTrue(await self.client.health())
        ops = await self.client.ops()
        self.assertEqual(ops.backend, "cpu")
        self.assertIn("matmul", [op.name for op in ops.ops])

    async def test_put_list_get_delete_with_progress(self):
        a = RNG.standard_normal((300, 200)).astype(np.float32)  # 240000 bytes: 3 chunks of 96 KiB
        async with opserve.aio.Client(self.server.target, chunk_bytes=96 << 10) as client:
            sent, received = [], []
            info = await client.put("A", a, progress=lambda done, total: sent.append(done))
            self.assertEqual((info.name, info.dtype, info.shape), ("A", opserve.DType.FLOAT32, (300, 200)))
            self.assertEqual([t.name for t in await client.list()], ["A"])
            got = await client.get("A", progress=lambda done, total: received.append(done))
        np.testing.assert_array_equal(got, a)
        self.assertEqual(sent, [98304, 196608, 240000])
        self.assertEqual(received, sent)
        self.assertEqual((await self.client.delete("A")).name, "A")
        self.assertEqual(await self.client.list(), [])

    async def test_bfloat16(self):
        x = RNG.standard_normal((4, 6)).astype(np.float32)
        bits = opserve.float32_to_bfloat16_bits(x)
        await self.client.put("h", x, dtype="bfloat16")
        np.testing.assert_array_equal(await self.client.get("h"), opserve.bfloat16_bits_to_float32(bits))
        np.testing.assert_array_equal(await self.client.get("h", raw_bfloat16=True), bits)

    async def test_run(self):
        a = RNG.standard_normal((64, 48)).astype(np.float32)
        b = RNG.standard_normal((48, 32)).astype(np.float32)
        await self.client.put("A", a)
        g = opserve.Graph()
        ab = g.matmul(g.stored("A"), g.input("B", b))
        g.output(g.row_mean(g.transpose(ab)), name="mean", store_as="MEAN")
        result = await self.client.run(g)
        want = (a.astype(np.float64) @ b.astype(np.float64)).mean(axis=0)
        np.testing.assert_allclose(result["mean"], want, rtol=1e-4, atol=1e-5)
        self.assertEqual([n.id for n in result.nodes], ["matmul_0", "transpose_1", "mean"])
        np.testing.assert_array_equal(await self.client.get("MEAN"), result["mean"])

    async def test_calls_in_flight_together(self):
        arrays = {f"t{i}": RNG.integers(0, 1000, (50, 40 + i), dtype=np.int64) for i in range(8)}
        await asyncio.gather(*(self.client.put(n, a) for n, a in arrays.items()))
        got = await asyncio.gather(*(self.client.get(n) for n in arrays))
        for (name, want), array in zip(arrays.items(), got):
            np.testing.assert_array_equal(array, want, err_msg=name)

    async def test_errors_carry_code_and_message(self):
        await self.assertError(grpc.StatusCode.NOT_FOUND, self.client.get("missing"), "'missing'")
        await self.assertError(grpc.StatusCode.NOT_FOUND, self.client.delete("missing"), "'missing'")
        await self.client.put("x", np.zeros(2, np.int32))
        await self.assertError(grpc.StatusCode.ALREADY_EXISTS, self.client.put("x", np.zeros(2, np.int32)),
                               "'x'")
        g = opserve.Graph()
        g.output(g.matmul(g.stored("x"), g.stored("x")))
        await self.assertError(grpc.StatusCode.INVALID_ARGUMENT, self.client.run(g), "matmul")


if __name__ == "__main__":
    unittest.main()
