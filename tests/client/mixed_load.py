#!/usr/bin/env python3
"""mixed_load.cc's load through the Python client: each of --threads threads, all on one Client,
loops put, get, run (row_sum of the stored tensor) and delete of a 4 MiB float32 tensor of its
own for --seconds; then each call's latency percentiles. Not a test. Run it with the opserve
package installed (the README's venv); --option adds a gRPC channel argument, e.g.
--option SingleThreadedUnaryStream=1.
"""

import argparse
import threading
import time

import numpy as np
import opserve


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--option", action="append", default=[], help="KEY=INT channel argument")
    args = parser.parse_args()
    options = [(k, int(v)) for k, v in (o.split("=", 1) for o in args.option)]
    client = opserve.Client(args.target, channel_options=options)
    data = np.random.default_rng(1).random((1024, 1024), dtype=np.float32)
    latencies = {k: [] for k in ("put", "get", "run", "delete")}
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i):
        name = f"mixed_py_{i}"
        graph = opserve.Graph()
        graph.output(graph.row_sum(graph.stored(name)))
        calls = (("put", lambda: client.put(name, data, overwrite=True)),
                 ("get", lambda: client.get(name)), ("run", lambda: client.run(graph)),
                 ("delete", lambda: client.delete(name)))
        mine = {k: [] for k in latencies}
        while not stop.is_set():
            for key, call in calls:
                start = time.perf_counter()
                call()
                mine[key].append((time.perf_counter() - start) * 1e3)
        with lock:
            for key, values in mine.items():
                latencies[key] += values

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    print(f"{args.threads} threads, 4 MiB tensors, {args.seconds:.0f} s, options {options}")
    for key, values in latencies.items():
        values.sort()
        pick = lambda p: values[min(len(values) - 1, int(p * len(values)))] if values else 0.0
        print(f"{key:7s} {len(values):6d} calls  p50 {pick(0.5):7.1f} ms  p90 {pick(0.9):7.1f} ms  "
              f"p99 {pick(0.99):7.1f} ms")


if __name__ == "__main__":
    main()
