"""examples/quickstart.py, as the README shows it, against a real CPU server."""

import os
import subprocess
import sys
import unittest

from client_support import ServerTestCase


class QuickstartTest(ServerTestCase):
    def test_quickstart_runs_and_matches_numpy(self):
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


if __name__ == "__main__":
    unittest.main()
