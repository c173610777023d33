#!/usr/bin/env python3
"""Summarises the server's request timelines (opserve --trace_requests=PATH): for each file, how
long calls spent between consecutive stages (percentiles over the calls that completed), and how
they arrived: the share of the time in which no call arrived for over --gap_us, and the size of the
bursts between such gaps. A burst served one call at a time waits in the lane's queue.

  scripts/trace-stages.py [--skip=N] [--gap_us=US] TRACE.csv [TRACE.csv ...]
"""
import argparse
import csv
import sys

SUFFIX = "_ns"


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def summarise(path, skip, gap_us):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        # The stages as the server names them, in the order it lists them.
        stages = [c[:-len(SUFFIX)] for c in reader.fieldnames if c.endswith(SUFFIX)]
        calls = [[int(r[s + SUFFIX]) for s in stages] for r in reader]
    calls = [c for c in calls if all(t > 0 for t in c)][skip:]  # completed calls, warm
    if len(calls) < 2:
        print(f"== {path}: {len(calls)} completed calls after the first {skip}: nothing to summarise")
        return False
    calls.sort(key=lambda c: c[0])
    wall_s = (calls[-1][0] - calls[0][0]) / 1e9
    print(f"== {path}: {len(calls)} calls in {wall_s:.2f} s ({len(calls) / wall_s:.0f} a second)")
    print(f"  {'stage':28s} {'p10 us':>8s} {'p50 us':>8s} {'p90 us':>8s} {'mean us':>8s}")
    spans = [(f"{a} -> {b}", i, i + 1) for i, (a, b) in enumerate(zip(stages, stages[1:]))]
    spans.append(("received -> finished (server)", 0, stages.index("finished")))
    for name, a, b in spans:
        us = [(c[b] - c[a]) / 1e3 for c in calls]
        print(f"  {name:28s} {pct(us, .1):8.1f} {pct(us, .5):8.1f} {pct(us, .9):8.1f} "
              f"{sum(us) / len(us):8.1f}")
    gaps = [(calls[i][0] - calls[i - 1][0]) / 1e3 for i in range(1, len(calls))]
    quiet = sum(g for g in gaps if g > gap_us)
    bursts, size = [], 1
    for g in gaps:
        if g > gap_us:
            bursts.append(size)
            size = 1
        else:
            size += 1
    bursts.append(size)
    print(f"  arrivals: no call for over {gap_us:.0f} us during {quiet / 1e3 / (wall_s * 1e3):.0%} "
          f"of the time; bursts between such gaps: p50 {pct(bursts, .5)} calls, p90 "
          f"{pct(bursts, .9)}")
    starts = sorted(c[stages.index("launch_begin")] for c in calls)
    spacing = [(starts[i] - starts[i - 1]) / 1e3 for i in range(1, len(starts))
               if starts[i] - starts[i - 1] <= gap_us * 1e3]
    print(f"  launches within a burst: one every {pct(spacing, .5):.1f} us (p50)")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--skip", type=int, default=100, help="calls left out at the start (warm-up)")
    ap.add_argument("--gap_us", type=float, default=100, help="a gap between arrivals this long ends a burst")
    args = ap.parse_args()
    ok = [summarise(p, args.skip, args.gap_us) for p in args.traces]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
