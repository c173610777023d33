"""A 300 MiB tensor through opserve.Client and back, bit for bit, with progress reported.

300 MiB is past gRPC's 4 MiB default message limit and the server's 256 MiB --max_message_bytes:
only chunked streaming carries it. The server gets a 1 GiB memory budget so the test does not
depend on the machine's RAM (its default is half of it).
"""

import time
import unittest

import numpy as np

import opserve
from client_support import ServerTestCase

MIB = 1 << 20
TOTAL_BYTES = 300 * MIB


class LargeTransferTest(ServerTestCase):
    server_args = (f"--memory_budget_bytes={1 << 30}",)

    def test_300_mib_round_trip(self):
        # Random bits seen as float32: every pattern, NaN payloads included, must survive.
        bits = np.random.default_rng(300).integers(0, 1 << 32, TOTAL_BYTES // 4, dtype=np.uint32)
        values = bits.view(np.float32).reshape(-1, 1024)
        with opserve.Client(self.server.target, timeout=240) as client:
            sent, received = [], []
            start = time.monotonic()
            info = client.put("big", values, progress=lambda done, total: sent.append((done, total)))
            put_s = time.monotonic() - start
            self.assertEqual((info.bytes, info.shape), (TOTAL_BYTES, (TOTAL_BYTES // 4096, 1024)))

            start = time.monotonic()
            got = client.get("big", progress=lambda done, total: received.append((done, total)))
            get_s = time.monotonic() - start
            client.delete("big")
        print(f"put {TOTAL_BYTES // MIB} MiB in {put_s:.2f} s ({TOTAL_BYTES / put_s / 1e9:.2f} GB/s), "
              f"get in {get_s:.2f} s ({TOTAL_BYTES / get_s / 1e9:.2f} GB/s)")
        self.assertEqual(got.dtype, np.float32)
        self.assertEqual(got.shape, values.shape)
        self.assertTrue(np.array_equal(got.view(np.uint32), values.view(np.uint32)))
        for reports in (sent, received):
            done = [d for d, _ in reports]
            self.assertEqual(done, sorted(done))
            self.assertEqual(reports[-1], (TOTAL_BYTES, TOTAL_BYTES))
            self.assertGreaterEqual(len(reports), TOTAL_BYTES // opserve.DEFAULT_CHUNK_BYTES)


if __name__ == "__main__":
    unittest.main()
