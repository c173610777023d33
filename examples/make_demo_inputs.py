#!/usr/bin/env python3
"""Writes the demo's inputs, a.npy (64x48) and b.npy (48x32), deterministically, stdlib only.

    python3 examples/make_demo_inputs.py [--out DIR] [--reference]

Values come from splitmix64 and are multiples of 2^-23 in [-1, 1): exact in float32, so a
float64 reference computed here sees exactly the numbers the server sees. --reference also prints
that reference for examples/demo_graph.json: row_mean(transpose(matmul(A, B))), 32 values.
The tests import this module for the same data (tests/python, tests/client).
"""

import argparse
import os
import struct

A_SHAPE, A_SEED = (64, 48), 1
B_SHAPE, B_SEED = (48, 32), 2
MASK64 = (1 << 64) - 1


def splitmix64(state):
    """Yields an endless stream of 64-bit values from `state` (Vigna's splitmix64)."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def matrix(rows, cols, seed):
    """A rows x cols list of lists of floats in [-1, 1), each exact in float32 (24 bits)."""
    stream = splitmix64(seed)
    return [[(next(stream) >> 40) / float(1 << 23) - 1.0 for _ in range(cols)]
            for _ in range(rows)]


def npy_bytes(rows):
    """A float32 C-order .npy (version 1.0) image of a list of equal-length rows."""
    shape = (len(rows), len(rows[0]))
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % shape
    # Pad with spaces and a newline so the data starts 64-byte aligned, as NumPy does.
    padded = header + " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    flat = [v for row in rows for v in row]
    return (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(padded)) + padded.encode("ascii") +
            struct.pack("<%df" % len(flat), *flat))


def demo_matrices():
    return matrix(*A_SHAPE, A_SEED), matrix(*B_SHAPE, B_SEED)


def row_mean_transpose_matmul(a, b):
    """Float64 reference of row_mean(transpose(matmul(a, b))): the mean of each column of a @ b.
    Also returns the same computed on absolute values, the scale a tolerance needs."""
    m, k, n = len(a), len(b), len(b[0])
    means, scales = [], []
    for j in range(n):
        column = [sum(a[i][p] * b[p][j] for p in range(k)) for i in range(m)]
        column_abs = [sum(abs(a[i][p] * b[p][j]) for p in range(k)) for i in range(m)]
        means.append(sum(column) / m)
        scales.append(sum(column_abs) / m)
    return means, scales


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                        help="directory for a.npy and b.npy (default: this script's)")
    parser.add_argument("--reference", action="store_true",
                        help="also print the float64 reference of the demo graph's output")
    args = parser.parse_args()
    a, b = demo_matrices()
    os.makedirs(args.out, exist_ok=True)
    for name, rows in (("a.npy", a), ("b.npy", b)):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(npy_bytes(rows))
    print("wrote %s (64x48) and %s (48x32)" % (os.path.join(args.out, "a.npy"),
                                               os.path.join(args.out, "b.npy")))
    if args.reference:
        means, _ = row_mean_transpose_matmul(a, b)
        print("reference row_mean(transpose(matmul(A, B))):")
        print(" ".join("%.6g" % v for v in means))


if __name__ == "__main__":
    main()
