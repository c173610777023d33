#!/usr/bin/env python3
"""Medians over rounds of each round's req/s over the same round's Health/Check.

Reads the windows CSV that `opserve-bench --ops=load` (or `--ops=service`) writes beside its
other files (load_windows.csv) and prints, per variant, lane count, concurrency and workload,
the median, lowest and highest of the per-round ratios: the figures PERFORMANCE.md gives for
servers compared side by side (--load_variant).

    scripts/load-ratios.py OUT_DIR/load_windows.csv
"""
import csv
import statistics
import sys
from collections import defaultdict


def main(path):
    rounds = defaultdict(dict)  # (variant, lanes, concurrency, round) -> {series: req/s}
    for row in csv.DictReader(open(path)):
        key = (row['variant'], row['lanes'], row['concurrency'], row['round'])
        rounds[key][row['series']] = float(row['req_per_s'])
    ratios, floors = defaultdict(list), defaultdict(list)
    for (variant, lanes, conc, _), series in rounds.items():
        health = series.get('health')
        if not health:
            continue
        floors[(variant, lanes, conc)].append(health)
        for name, req_per_s in series.items():
            if name != 'health':
                ratios[(variant, lanes, conc, name)].append(req_per_s / health)
    for key in sorted(ratios, key=lambda k: (k[0], int(k[1]), int(k[2]), k[3])):
        v = ratios[key]
        print(f"{key[0] or '-':10s} lanes {key[1]} c={key[2]:>3s} {key[3]:22s} "
              f"median {statistics.median(v):.3f}  min {min(v):.3f} max {max(v):.3f}  "
              f"(rounds {len(v)}, health median {statistics.median(floors[key[:3]]):.0f} req/s)")


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
