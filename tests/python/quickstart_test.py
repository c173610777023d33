"""examples/quickstart.py, as the README shows it, against a real CPU server."""

import os
import subprocess
import sys
import unittest

import numpy as np

import opserve
from client_support import ServerTestCase


class QuickstartTest(ServerTestCase):
    def test_quickstart_runs_and_matches_numpy(self):
        # A user's own tensors named as the example's inputs are: the example must leave them.
        mine = {"A": np.arange(6, dtype=np.int32).reshape(2, 3), "MEAN": np.ones(4, np.float32)}
        with opserve.Client(self.server.target) as client:
            for name, array in mine.items():
                client.put(name, array)
        examples = os.environ.get("OPSERVE_EXAMPLES") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "examples")
        run = subprocess.run([sys.executable, os.path.join(examples, "quickstart.py"),
                              "--target", self.server.target],
                             capture_output=True, text=True, timeout=120)
        print(run.stdout, run.stderr, sep="")
        self.assertEqual(run.returncode, 0)
        lines = run.stdout.splitlines()
        self.assertIn("serving: True, backend cpu on", lines[0])
        self.assertTrue(any(line.split()[:3] == ["node", "op", "algorithm"] for line in lines))
        self.assertTrue(any(line.startswith("mean ") and "row_mean" in line for line in lines))
        self.assertIn("as expected: NOT_FOUND: ", run.stdout)
        self.assertTrue(lines[-1].startswith("matches numpy"))
        self.assertTrue(any(line.split()[-2:] == ["fused", "into"] for line in lines), run.stdout)
        with opserve.Client(self.server.target) as client:
            self.assertEqual(sorted(t.name for t in client.list()), sorted(mine))
            for name, array in mine.items():
                np.testing.assert_array_equal(client.get(name), array, err_msg=name)


if __name__ == "__main__":
    unittest.main()
