#!/usr/bin/env python3
"""opserve from Python: keep a matrix on the server, run a graph on it, read the results.

Needs the opserve package (README, "Python client") and a running server, e.g.
build/server/opserve --device=cpu (the CPU backend runs anywhere):

    python examples/quickstart.py --target 127.0.0.1:50051
"""

import argparse
import sys

import numpy as np

import opserve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the server's host:port")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 48), dtype=np.float32)
    b = rng.standard_normal((48, 32), dtype=np.float32)

    with opserve.Client(args.target, timeout=60) as client:
        ops = client.ops()
        print(f"serving: {client.health()}, backend {ops.backend} on {ops.device}")

        # A stays on the server under its name, for any later request to use.
        client.put("A", a, overwrite=True,
                   progress=lambda done, total: print(f"put A: {done}/{total} bytes"))

        # mean of each column of A·B = row_mean(transpose(matmul(A, B))). B travels inline with
        # the request. cuBLAS where the server has it (a GPU); the CPU backend has its reference.
        matmul = [algorithm.name for algorithm in ops.op("matmul").algorithms]
        g = opserve.Graph()
        ab = g.matmul(g.stored("A"), g.input("B", b),
                      algorithm="cublas" if "cublas" in matmul else "auto")
        g.output(g.row_mean(g.transpose(ab)), name="mean", store_as="MEAN", overwrite=True)
        result = client.run(g)

        mean = result["mean"]  # a numpy array
        print(f"mean[:4] = {mean[:4]}")
        result.print_table()   # per node: the algorithm that ran, kernel_us, bytes, GB/s
        print("stored:", ", ".join(f"{t.name} {t.dtype}{list(t.shape)}" for t in client.list()))

        try:
            client.get("no_such_tensor")
        except opserve.OpserveError as e:
            print(f"as expected: {e.code.name}: {e.message}")

        kept = client.get("MEAN")  # the copy the server kept
        client.delete("A")
        client.delete("MEAN")

    want = (a.astype(np.float64) @ b.astype(np.float64)).mean(axis=0)
    if not (np.allclose(mean, want, rtol=1e-4, atol=1e-5) and np.array_equal(kept, mean)):
        print("the results differ from numpy's", file=sys.stderr)
        return 1
    print(f"matches numpy: largest difference {np.abs(mean - want).max():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
