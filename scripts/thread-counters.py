#!/usr/bin/env python3
"""Per-thread CPU, sleeps and run-queue waits of processes over an interval, per call.

Linux keeps, for every thread, its CPU time and time spent runnable but waiting for a core
(/proc/PID/task/TID/schedstat) and how often it slept (voluntary_ctxt_switches) or was
preempted (nonvoluntary_ctxt_switches) in /proc/PID/task/TID/status. Two snapshots around a load
of known calls tell which threads a call wakes and costs: PERFORMANCE.md's per-thread figures
for the service under load come from it (the GPU machines have no perf or strace).

    scripts/thread-counters.py snap PID [PID...] > before.json
    ... the load runs ...
    scripts/thread-counters.py snap PID [PID...] > after.json
    scripts/thread-counters.py diff before.json after.json CALLS

Threads are grouped by process and name, a trailing number folded ("lane0-complete1" and
"lane0-complete" stay apart; "nexting_thread" counts all of them).
"""
import json
import os
import re
import sys
from collections import defaultdict


def snap(pids):
    out = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            base = f"/proc/{pid}/task/{tid}"
            try:
                status = open(f"{base}/status").read()
                name = open(f"{base}/comm").read().strip()
                run_ns, wait_ns, _ = map(int, open(f"{base}/schedstat").read().split())
            except OSError:
                continue  # the thread ended between the listing and the read
            slept = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
            preempted = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
            out[f"{pid}/{tid}"] = [f"{pid}:{name}", slept, preempted, run_ns, wait_ns]
    return out


def diff(before_path, after_path, calls):
    before, after = json.load(open(before_path)), json.load(open(after_path))
    groups = defaultdict(lambda: [0, 0, 0, 0, 0])  # threads, slept, preempted, run, wait
    for key, now in after.items():
        then = before.get(key, [now[0], 0, 0, 0, 0])
        g = groups[re.sub(r"\d+$", "#", now[0])]
        g[0] += 1
        for i in range(1, 5):
            g[i] += now[i] - then[i]
    print(f"  {'threads':40s} {'n':>3s} {'sleeps/call':>11s} {'preempted/call':>14s} "
          f"{'cpu us/call':>11s} {'runq us/call':>12s}")
    for name, g in sorted(groups.items(), key=lambda item: -item[1][3]):
        if g[1] == 0 and g[3] == 0:
            continue
        print(f"  {name:40s} {g[0]:3d} {g[1] / calls:11.3f} {g[2] / calls:14.3f} "
              f"{g[3] / 1e3 / calls:11.2f} {g[4] / 1e3 / calls:12.2f}")


if __name__ == '__main__':
    if len(sys.argv) >= 3 and sys.argv[1] == 'snap':
        json.dump(snap(sys.argv[2:]), sys.stdout)
    elif len(sys.argv) == 5 and sys.argv[1] == 'diff':
        diff(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)
