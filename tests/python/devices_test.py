"""opserve.Client (and opserve.aio.Client) against a real server of two CPU devices
(opserve --device=cpu:2): devices(), put(device=, shard=), move(), the shards of a TensorInfo,
where a graph ran and what it copied between devices, output(device=), the placement mistakes;
and, in a test build, a failed device (--test_fail_device) as DeviceInfo shows it."""

import os
import subprocess
import unittest

import grpc
import numpy as np

import opserve
import opserve.aio
from client_support import ClientTestCase, Server, ServerTestCase, work_dir

RNG = np.random.default_rng(2)
DEVICES = ("cpu:0", "cpu:1")


def floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


class DevicesTest(ClientTestCase):
    server_device = "cpu:2"


    def test_devices(self):
        devices = self.client.devices()
        self.assertEqual(tuple(d.name for d in devices), DEVICES)
        self.assertEqual(self.client.ops().devices, devices)
        for d in devices:
            self.assertIsInstance(d, opserve.DeviceInfo)
            self.assertTrue(d.serving, d.error)
            self.assertEqual((d.error, d.capability), ("", "cpu"))
            self.assertTrue(d.description)
            self.assertGreater(d.memory_budget, 0)
            self.assertLessEqual(d.memory_used, d.memory_budget)
            self.assertTrue(d.algorithms)
        self.assertEqual(devices[0].algorithms, devices[1].algorithms)
        # What ListOps lists as ops, each device runs.
        listed = {f"{op.name}/{a.name}" for op in self.client.ops().ops for a in op.algorithms}
        self.assertEqual(set(devices[0].algorithms), listed)

    def test_memory_used_follows_placement(self):
        a = floats(256, 64)
        before = {d.name: d.memory_used for d in self.client.devices()}
        self.client.put("A", a, device="cpu:1")
        after = {d.name: d.memory_used for d in self.client.devices()}
        self.assertGreaterEqual(after["cpu:1"] - before["cpu:1"], a.nbytes)
        self.assertEqual(after["cpu:0"], before["cpu:0"])

    def test_put_where_asked_and_move(self):
        a = floats(16, 8)
        info = self.client.put("A", a, device="cpu:1")
        self.assertEqual((info.device, info.shards, info.sharded), ("cpu:1", (), False))
        self.assertEqual(self.client.list(), [info])
        moved = self.client.move("A", "cpu:0")
        self.assertIsInstance(moved, opserve.MoveResult)
        self.assertEqual(moved.info.device, "cpu:0")
        self.assertEqual(moved.bytes, a.nbytes)
        self.assertGreaterEqual(moved.seconds, 0)
        self.assertEqual(self.client.move("A", "cpu:0").bytes, 0)  # there already
        self.assertEqual(self.client.list()[0].device, "cpu:0")
        np.testing.assert_array_equal(self.client.get("A"), a)

    def test_put_without_a_device_takes_the_one_with_most_free_memory(self):
        self.client.put("big", floats(512, 64), device="cpu:0")
        self.assertEqual(self.client.put("next", floats(4, 4)).device, "cpu:1")

    def test_put_through_shared_memory_is_placed_too(self):
        a = floats(8, 8)
        self.assertEqual(self.client.put("S", a, device="cpu:1", shm=True).device, "cpu:1")
        sharded = self.client.put("T", a, shard=True, shm=True)
        self.assertEqual([s.device for s in sharded.shards], list(DEVICES))
        np.testing.assert_array_equal(self.client.get("T", shm=True), a)

    def test_shard_by_rows(self):
        s = floats(5, 3)  # 5 rows over 2 devices: 3 on the first, 2 on the second
        info = self.client.put("S", s, shard=True)
        self.assertTrue(info.sharded)
        self.assertEqual(info.device, "cpu:0,cpu:1")
        self.assertEqual(info.shards, (opserve.TensorShard("cpu:0", 0, 3, 36),
                                       opserve.TensorShard("cpu:1", 3, 2, 24)))
        self.assertEqual(self.client.list()[0].shards, info.shards)
        np.testing.assert_array_equal(self.client.get("S"), s)

        g = opserve.Graph()
        g.output(g.row_sum(g.stored("S")), name="rs", store_as="RS")
        result = self.client.run(g)
        self.assertEqual(result.device, "cpu:0,cpu:1")
        np.testing.assert_allclose(result["rs"], s.sum(axis=1), rtol=1e-6, atol=1e-6)
        self.assertEqual([s.device for s in result.stored[0].shards], list(DEVICES))

        gathered = self.client.move("S", "cpu:1")
        self.assertEqual((gathered.info.device, gathered.info.shards), ("cpu:1", ()))
        self.assertTrue(0 < gathered.bytes <= s.nbytes, gathered)
        np.testing.assert_array_equal(self.client.get("S"), s)

    def test_a_run_says_where_it_ran_and_what_it_copied(self):
        a, b = floats(64, 48), floats(48, 32)
        self.client.put("A", a, device="cpu:1")  # the larger input: the graph runs there
        self.client.put("B", b, device="cpu:0")
        g = opserve.Graph()
        g.output(g.matmul(g.stored("A"), g.stored("B")), name="ab", store_as="AB",
                 device="cpu:0")
        result = self.client.run(g)
        self.assertEqual(result.device, "cpu:1")
        # B came over to cpu:1, and the product went back to cpu:0 to be kept there.
        self.assertEqual(result.peer_copy_bytes, b.nbytes + (a @ b).nbytes)
        self.assertGreaterEqual(result.peer_copy_us, 0)
        self.assertEqual(result.peer_copy_us, result.timing.peer_copy_us)
        self.assertEqual(result.stored[0].device, "cpu:0")
        self.assertEqual({t.name: t.device for t in self.client.list()}["AB"], "cpu:0")
        np.testing.assert_allclose(result["ab"], a @ b, rtol=1e-5, atol=1e-4)
        table = result.table()
        self.assertIn("device cpu:1: queue", table)
        self.assertIn("peer copies: 14.0 KiB in ", table)

        # Inline inputs alone: nothing copied, no such line; back-to-back runs alternate.
        g = opserve.Graph()
        g.output(g.sum(g.input("x", b)), name="s")
        ran_on = set()
        for _ in range(2):
            result = self.client.run(g)
            self.assertEqual(result.peer_copy_bytes, 0)
            self.assertNotIn("peer copies", result.table())
            ran_on.add(result.device)
        self.assertEqual(ran_on, set(DEVICES))

    def test_output_device_goes_into_the_request(self):
        g = opserve.Graph()
        x = g.transpose(g.stored("A"))
        g.output(x, store_as="AT", device="cuda:1")
        self.assertEqual(g.to_request().outputs[0].device, "cuda:1")
        g = opserve.Graph()
        with self.assertRaisesRegex(ValueError, "stores nothing"):
            g.output(g.transpose(g.stored("A")), device="cpu:1")

    def test_placement_mistakes(self):
        a = floats(4, 4)
        with self.assertRaisesRegex(ValueError, "shard=True .* takes no device"):
            self.client.put("X", a, device="cpu:0", shard=True)
        with self.assertRaisesRegex(TypeError, "device must be a device name"):
            self.client.put("X", a, device=1)
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.put("X", a, device="cpu:7"), "cpu:7")
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.put("V", floats(4), shard=True))
        self.assertEqual(self.client.list(), [])
        self.assertError(grpc.StatusCode.NOT_FOUND, lambda: self.client.move("nope", "cpu:0"),
                         "nope")
        self.client.put("A", a)
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.move("A", "cpu:9"), "cpu:9")


class AioDevicesTest(ServerTestCase, unittest.IsolatedAsyncioTestCase):
    server_device = "cpu:2"

    async def asyncSetUp(self):
        self.client = opserve.aio.Client(self.server.target, timeout=30)

    async def asyncTearDown(self):
        for info in await self.client.list():
            await self.client.delete(info.name)
        await self.client.close()

    async def test_devices_put_move_run(self):
        self.assertEqual(tuple(d.name for d in await self.client.devices()), DEVICES)
        a = floats(6, 4)
        self.assertEqual((await self.client.put("A", a, device="cpu:1")).device, "cpu:1")
        moved = await self.client.move("A", "cpu:0")
        self.assertEqual((moved.info.device, moved.bytes), ("cpu:0", a.nbytes))
        info = await self.client.put("S", a, shard=True)
        self.assertEqual([(s.row_begin, s.rows) for s in info.shards], [(0, 3), (3, 3)])
        # matmul(sharded, whole): B goes to both shards' devices, C comes back whole.
        g = opserve.Graph()
        g.output(g.matmul(g.stored("S"), g.input("B", a.T.copy())), name="m")
        result = await self.client.run(g)
        self.assertEqual(result.device, "cpu:0,cpu:1")
        np.testing.assert_allclose(result["m"], a @ a.T, rtol=1e-5, atol=1e-5)


def has_test_hooks():
    done = subprocess.run([os.environ["OPSERVE_BINARY"], "--help"], capture_output=True,
                          text=True)
    return "--test_fail_device" in done.stdout + done.stderr


class FailedDeviceTest(unittest.TestCase):
    """--test_fail_device=cpu:1: the first request that runs on cpu:1 fails INTERNAL and takes
    it out; DeviceInfo says so and why, and the other device keeps serving."""

    @classmethod
    def setUpClass(cls):
        if not has_test_hooks():
            raise unittest.SkipTest("this server build has no test hooks (OPSERVE_TEST_HOOKS)")
        cls.server = Server(work_dir(cls.__name__), ("--test_fail_device=cpu:1",),
                            device="cpu:2")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_a_failed_device(self):
        with opserve.Client(self.server.target, timeout=30, retry=False) as client:
            g = opserve.Graph()
            g.output(g.sum(g.input("x", floats(8))), name="s")
            failures = []
            for _ in range(2):  # inline inputs alternate: one of these lands on cpu:1
                try:
                    client.run(g)
                except opserve.OpserveError as e:
                    failures.append(e)
            self.assertEqual([e.code for e in failures], [grpc.StatusCode.INTERNAL], failures)
            devices = {d.name: d for d in client.devices()}
            self.assertTrue(devices["cpu:0"].serving)
            self.assertFalse(devices["cpu:1"].serving)
            self.assertTrue(devices["cpu:1"].error)
            self.assertTrue(client.health())
            with self.assertRaises(opserve.OpserveError) as caught:
                client.put("A", floats(4), device="cpu:1")
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("cpu:1", caught.exception.message)
            self.assertEqual(client.put("A", floats(4)).device, "cpu:0")
            self.assertEqual(client.run(g).device, "cpu:0")


if __name__ == "__main__":
    unittest.main()
