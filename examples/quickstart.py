#!/usr/bin/env python3
"""opserve from Python: keep a matrix on the server, run a graph on it, read the results.

Needs the opserve package (README, "Quickstart") and a running server, e.g.
build/server/opserve --device=cpu (the CPU backend runs anywhere):

    python examples/quickstart.py --target 127.0.0.1:50051
"""

import argparse
import sys
import uuid

import numpy as np

import opserve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the server's host:port")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 48), dtype=np.float32)
    b = rng.standard_normal((48, 32), dtype=np.float32)

    # Names of this run's own: a server is shared, and a tensor someone else keeps as "A" must
    # survive this example.
    prefix = f"quickstart/{uuid.uuid4().hex[:12]}"
    a_name, mean_name = f"{prefix}/A", f"{prefix}/MEAN"
    with opserve.Client(args.target) as client:
        ops = client.ops()
        print(f"serving: {client.health()}, backend {ops.backend} on {ops.device}")

        # A stays on the server under its name, for any later request to use.
        client.put(a_name, a, progress=lambda done, total: print(f"put A: {done}/{total} bytes"))
        try:
            # mean of each column of A·B = row_mean(transpose(matmul(A, B))). B travels inline
            # with the request; "auto" lets the server choose each algorithm (cuBLAS on a GPU,
            # its reference on the CPU), and the table below says which ran.
            g = opserve.Graph()
            ab = g.matmul(g.stored(a_name), g.input("B", b))
            g.output(g.row_mean(g.transpose(ab)), name="mean", store_as=mean_name)
            result = client.run(g)

            mean = result["mean"]  # a numpy array
            print(f"mean[:4] = {mean[:4]}")
            # Per node: the algorithm that ran, kernel_us, bytes, GB/s; the transpose and the mean
            # run as one kernel ("fused into"), which the total counts once.
            result.print_table()
            print("stored:", ", ".join(f"{t.name} {t.dtype}{list(t.shape)}"
                                       for t in client.list() if t.name.startswith(prefix)))

            try:
                client.get(f"{prefix}/no_such_tensor")
            except opserve.OpserveError as e:
                print(f"as expected: {e.code.name}: {e.message}")

            kept = client.get(mean_name)  # the copy the server kept
        finally:
            for name in (a_name, mean_name):
                try:
                    client.delete(name)
                except opserve.OpserveError:
                    pass  # not made: the run failed before storing it

    want = (a.astype(np.float64) @ b.astype(np.float64)).mean(axis=0)
    if not (np.allclose(mean, want, rtol=1e-4, atol=1e-5) and np.array_equal(kept, mean)):
        print("the results differ from numpy's", file=sys.stderr)
        return 1
    print(f"matches numpy: largest difference {np.abs(mean - want).max():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
