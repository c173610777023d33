#!/usr/bin/python3
"""opserve-cli end to end, stdlib only: the README's demo steps against a real opserve, checked.

Generates the demo inputs (examples/make_demo_inputs.py) into --work-dir next to a copy of
examples/demo_graph.json, starts opserve on a free loopback port, then runs the CLI:
health, put, run (text and --json, compared with the float64 reference), get, ls --json, rm,
and the failure paths: a gRPC error (code name, exit 1), bad .npy and graph files (the file and
the JSON path named, exit 1) and usage errors (exit 2). cli_ux_checks.py adds what a user meets:
one-line usage errors, JSON numbers, OS reasons and line:column, the progress bar on a terminal
only, bench rows as measured, and the default deadlines against a server that never answers
(these run in the background from the start, since they take the default's 30 s).
cli_device_checks.py then runs against a second server of two CPU devices (--device=cpu:2):
ops' device table, put --device and --shard, ls with shards, move, where a graph ran and its
peer copies; and, in a test build, against a third whose cpu:1 fails (--test_fail_device).
"""

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
from e2e_script import Failure, check, logger, report_failure, start_opserve  # noqa: E402
import cli_device_checks as devices  # noqa: E402 - beside this file
import cli_ux_checks as ux  # noqa: E402 - beside this file

FLOAT32_EPS = 2.0 ** -24


log = logger("cli_e2e")


class Cli:
    def __init__(self, binary, target, cwd):
        self.binary, self.target, self.cwd = binary, target, cwd
        self.last_pid = None  # of the last run: the client library names its shm objects by it

    def __call__(self, *args, code=0, target=True):
        """target: True for the server's, False for none, or another HOST:PORT; code: the exit
        status expected, None for any."""
        if target is True:
            target = self.target
        argv = [self.binary] + ([f"--target={target}"] if target else []) + list(args)
        with subprocess.Popen(argv, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as process:
            self.last_pid = process.pid
            try:
                stdout, stderr = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        done = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
        shown = " ".join(args)
        check(code is None or done.returncode == code,
              f"`opserve-cli {shown}` exited {done.returncode}, expected {code}\n"
              f"stdout: {done.stdout}\nstderr: {done.stderr}")
        log(f"opserve-cli {shown}: exit {done.returncode}")
        return done.stdout, done.stderr


def wait_healthy(cli, server, deadline):
    while True:
        done = subprocess.run([cli.binary, f"--target={cli.target}", "--timeout=2", "health"],
                              capture_output=True, text=True)
        if done.returncode == 0 and "SERVING" in done.stdout:
            return
        if server.poll() is not None:
            raise Failure(f"opserve exited {server.returncode} during start-up")
        if time.monotonic() > deadline:
            raise Failure(f"opserve not healthy in time: {done.stderr.strip()}")
        time.sleep(0.2)


def check_means(values, demo):
    a, b = demo.demo_matrices()
    reference, scales = demo.row_mean_transpose_matmul(a, b)
    check(len(values) == len(reference), f"{len(values)} outputs, expected {len(reference)}")
    for j, (value, want, scale) in enumerate(zip(values, reference, scales)):
        tolerance = 2 * (48 + 64 + 2) * FLOAT32_EPS * scale + 1e-7
        check(abs(value - want) <= tolerance, f"col_mean[{j}] = {value}, reference {want}")


def exercise(cli, work, demo):
    deadlines = ux.DeadlineChecks(cli, work)  # 30 s in the background
    try:
        exercise_all(cli, work, demo, deadlines)
    finally:
        deadlines.close()


def exercise_all(cli, work, demo, deadlines):
    out, _ = cli("health")
    check(out.strip() == "SERVING", f"health printed {out!r}")
    out, _ = cli("put", "A", "a.npy", "--overwrite")
    check("put A: float32[64, 48]" in out and "GB/s" in out, f"put printed {out!r}")

    out, _ = cli("run", "demo_graph.json", "--json")
    result = json.loads(out)
    output = result["outputs"]["col_mean"]
    check(output["dtype"] == "FLOAT32" and output["shape"] == [32], f"col_mean: {output}")
    check_means(output["values"], demo)
    nodes = result["response"]["nodes"]
    check([n["id"] for n in nodes] == ["ab", "ab_t", "col_mean"], f"nodes {nodes}")
    check(all(n["algorithm"] not in ("", "auto") for n in nodes), "each node names its algorithm")
    check(result["response"]["stored"][0]["name"] == "AB", "AB stored")
    log("run --json: col_mean matches the float64 reference")

    out, _ = cli("run", "demo_graph.json")
    for text in ("output col_mean: float32[32] = [", "stored AB: float32[64, 32]", "algorithm",
                 "kernel_us", "GB/s", "GFLOP/s", "queue", "total"):
        check(text in out, f"run's text output lacks {text!r}:\n{out}")
    # The planner runs row_mean(transpose(AB)) as one column mean: the transpose's row names the
    # node whose kernel ran it.
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    check("fused into" in out, f"run's table lacks the fused-into column:\n{out}")
    check(rows.get("ab_t", [None])[-1] == "col_mean", f"ab_t's row does not name col_mean:\n{out}")
    check("fused:col_mean" in rows.get("ab_t", []), f"ab_t's row does not name the kernel:\n{out}")

    out, _ = cli("get", "AB", "ab.npy")
    check("got AB: float32[64, 32]" in out and "GB/s" in out, f"get printed {out!r}")
    with open(os.path.join(work, "ab.npy"), "rb") as f:
        image = f.read()
    header_len = struct.unpack("<H", image[8:10])[0]
    check(b"'shape': (64, 32)" in image[10:10 + header_len], "ab.npy header")
    check(len(image) == 10 + header_len + 64 * 32 * 4, f"ab.npy is {len(image)} bytes")

    # The same bytes through a shared-memory object instead of the socket (same host).
    out, _ = cli("put", "A_shm", "a.npy", "--shm")
    pids = [cli.last_pid]
    check("put A_shm: float32[64, 48]" in out, f"put --shm printed {out!r}")
    out, _ = cli("get", "A_shm", "a_shm.npy", "--shm")
    pids.append(cli.last_pid)
    check("got A_shm: float32[64, 48]" in out, f"get --shm printed {out!r}")
    with open(os.path.join(work, "a.npy"), "rb") as f, open(os.path.join(work, "a_shm.npy"), "rb") as g:
        check(f.read() == g.read(), "a.npy put and got back through --shm differs")
    # Only these two processes' objects: other tests' clients may hold theirs right now.
    ours = tuple(f"opserve-client-{pid}-" for pid in pids)
    check(not [n for n in os.listdir("/dev/shm") if n.startswith(ours)],
          "--shm left its shared-memory object behind")
    log("put/get --shm: the same bytes back, no object left")

    out, _ = cli("ls", "--json")
    names = {t["name"] for t in json.loads(out).get("tensors", [])}
    check({"A", "AB"} <= names, f"ls --json: {names}")

    cli("rm", "AB")
    _, err = cli("get", "AB", "gone.npy", code=1)
    check("NOT_FOUND: " in err, f"a gRPC error names its code: {err!r}")

    # Local failures: the file and what was wrong, exit 1, before anything is sent.
    header = b"{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n"
    with open(os.path.join(work, "bad.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\0\0\0\1")
    _, err = cli("put", "X", "bad.npy", code=1)
    check("bad.npy" in err and "big-endian" in err, f"bad .npy: {err!r}")
    _, err = cli("put", "X", "missing.npy", code=1)
    check("missing.npy: cannot open" in err, f"missing .npy: {err!r}")
    with open(os.path.join(work, "bad_graph.json"), "w") as f:
        json.dump({"nodes": [{"id": "x", "opp": "sum"}]}, f)
    _, err = cli("run", "bad_graph.json", code=1)
    check("bad_graph.json" in err and "opp" in err, f"bad graph: {err!r}")
    with open(os.path.join(work, "npy_graph.json"), "w") as f:
        json.dump({"inlineTensors": {"B": {"npy": "nope.npy"}}}, f)
    _, err = cli("run", "npy_graph.json", code=1)
    check("$.inlineTensors.B.npy" in err and "nope.npy" in err, f"graph with a missing .npy: {err!r}")

    ux.check_usage_errors(cli)
    log("usage errors: one line each, --help the whole text")
    ux.check_json_numbers(cli)
    log("--json: integers are JSON numbers")
    ux.check_error_texts(cli, work)
    log("errors: the OS reason, JSON line:column, a warning for a graph that keeps nothing")
    ux.check_progress(cli, work)
    log("progress: a bar on a terminal over 64 MiB, nothing when piped or small")
    ux.check_bench_streams(cli, work)
    log("bench: each level's row read before the sweep ends, text and --json")
    deadlines.check_explicit()
    deadlines.check_defaults()
    log("deadlines: DEADLINE_EXCEEDED by --timeout and by the default; a graph run waits")
    cli("rm", "A")


def stop(server):
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def has_test_hooks(opserve):
    """Whether this server build takes the test-only flags (OPSERVE_TEST_HOOKS)."""
    done = subprocess.run([opserve, "--help"], capture_output=True, text=True)
    return "--test_fail_device" in done.stdout + done.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", required=True)
    parser.add_argument("--opserve", required=True)
    parser.add_argument("--examples", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--multi-device", default="cpu:2",
                        help="the --device of the server the device checks run against")
    args = parser.parse_args()
    servers = []

    def start(name, device, *extra):
        server, port = start_opserve(args.opserve, device,
                                     os.path.join(args.work_dir, f"{name}.log"), extra)
        servers.append(server)
        cli = Cli(args.cli, f"127.0.0.1:{port}", args.work_dir)
        wait_healthy(cli, server, time.monotonic() + 60)
        return cli

    try:
        shutil.rmtree(args.work_dir, ignore_errors=True)
        os.makedirs(args.work_dir)
        sys.path.insert(0, args.examples)
        import make_demo_inputs as demo  # noqa: E402 - the demo's own data
        subprocess.run([sys.executable, os.path.join(args.examples, "make_demo_inputs.py"),
                        "--out", args.work_dir], check=True)
        shutil.copy(os.path.join(args.examples, "demo_graph.json"), args.work_dir)

        exercise(start("opserve", args.device), args.work_dir, demo)
        stop(servers.pop())

        devices.exercise(start("opserve_devices", args.multi_device), args.work_dir, demo)
        log(f"--device={args.multi_device}: ops, put --device/--shard, ls, move, run's device and "
            "peer copies")
        stop(servers.pop())
        if has_test_hooks(args.opserve):
            devices.check_failed_device(
                start("opserve_failed_device", args.multi_device, "--test_fail_device=cpu:1"),
                args.work_dir)
            log("a failed device: ops shows it out with its error, the other keeps serving")
        else:
            log("no test hooks in this build: the failed-device checks did not run")
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        report_failure(log, e)
        return 1
    finally:
        for server in servers:
            stop(server)
    log("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
