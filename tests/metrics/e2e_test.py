#!/usr/bin/python3
"""End-to-end metrics test: the real opserve, a real Prometheus, the real recording rules.

1. Starts `opserve --device=cpu` on loopback and a Prometheus server (temporary storage, scrape
   and rule evaluation every second, deploy/prometheus/rules loaded) that scrapes its /metrics.
   The server runs two lanes.
2. Before any request: every kernel series (the four opserve_kernel_* families, one per op and
   algorithm of the backend's table, as ListOps then lists them) exists at 0 on /metrics and in
   Prometheus, and so does each lane's opserve_lane_inflight. Every series of a device-level
   family names one of the server's devices in its `device` label, each device has each of them,
   and each device serves (opserve_device_serving 1), on /metrics and in Prometheus.
3. Over gRPC (Debian's python3-grpcio, stubs generated here with protoc and grpc_python_plugin):
   ListOps (against the op table, read through opserve-op-table: no op list here), then Execute
   graphs of every op with every algorithm the server lists, on inline tensors shaped from the
   op's test model, in two rounds so that every kernel series has samples before and after an increase.
   One malformed graph checks that failures are counted under their code.
4. Asks Prometheus' HTTP API (/api/v1/query) until, or fails after a deadline:
   - instance_op_algorithm:opserve_kernel_gigabytes_per_second:rate5m > 0 for every (op,
     algorithm) that ran, and the GFLOP/s rule > 0 for matmul;
   - opserve_requests_total by (rpc, code) equal to the requests this test sent and the codes it
     got back; the error-ratio and latency recording rules present;
   - the busy rule (kernel seconds per wall second) > 0 for the server's device, and so is the
     per-device GB/s rule; Execute's queue waits are counted on that device.
5. Lints the server's own /metrics with `promtool check metrics`.

Everything is bounded in time (--timeout, and a deadline on every wait); both servers are stopped
on every exit path. Needs: prometheus, promtool, protoc, grpc_python_plugin, python3-grpcio.
"""

import argparse
import base64
import collections
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
import op_table  # noqa: E402 - the op table through opserve-op-table: no op list here
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
from e2e_script import free_port  # noqa: E402 - below the ephemeral range, for Prometheus

LANES = 2
# Input elements per op: enough that a CPU kernel takes a measurable time, few enough for a
# 2-core CI box.
ELEMENTS = 192 * 256
BUSY_RULE = "instance_device:opserve_kernel_busy:ratio_rate5m"
DEVICE_GBPS_RULE = "instance_device:opserve_kernel_gigabytes_per_second:rate5m"
KERNEL_FAMILIES = ("opserve_kernel_seconds_total", "opserve_kernel_bytes_total",
                   "opserve_kernel_flops_total", "opserve_kernel_launches_total")
GBPS_RULE = "instance_op_algorithm:opserve_kernel_gigabytes_per_second:rate5m"
GFLOPS_RULE = "instance_op_algorithm:opserve_kernel_gigaflops_per_second:rate5m"
# Families whose every series carries device=<the device's name>; opserve_device_memory_bytes
# names the devices the server serves.
DEVICE_FAMILIES = KERNEL_FAMILIES + (
    "opserve_device_memory_bytes", "opserve_tensors", "opserve_device_serving",
    "opserve_device_queue_depth", "opserve_peer_copy_bytes_total",
    "opserve_peer_copy_seconds_total", "opserve_lane_inflight", "opserve_graph_replays_total",
    "opserve_queue_duration_seconds_count")
JOB = "opserve"


class Failure(Exception):
    pass


class ProcessDied(Failure):
    """A server this test started exited: no point waiting any longer."""


def log(*args):
    print("e2e:", *args, flush=True)


def wait_for(what, check, deadline, interval=0.25):
    """Polls check() until it returns a truthy value; raises Failure with the last value at the
    deadline. check may raise to mean "not yet"."""
    last = None
    while True:
        try:
            last = check()
            if last:
                return last
        except ProcessDied:
            raise
        except Exception as e:  # noqa: BLE001 - any other error means "not yet"
            last = e
        if time.monotonic() > deadline:
            raise Failure(f"timed out waiting for {what}; last: {last!r}")
        time.sleep(interval)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Processes:
    """The child processes this test started; stopped in reverse order, each by its own pid."""

    def __init__(self):
        self.procs = []

    def start(self, name, argv, log_path):
        log(f"starting {name}: {' '.join(argv)}")
        out = open(log_path, "wb")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((name, proc, out, log_path))
        return proc

    def check_alive(self):
        for name, proc, _, log_path in self.procs:
            if proc.poll() is not None:
                raise ProcessDied(f"{name} exited with {proc.returncode}:\n{tail(log_path)}")

    def stop_all(self):
        for name, proc, out, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log(f"{name} ignored SIGTERM; killing it")
                    proc.kill()
                    proc.wait(timeout=10)
            out.close()
        self.procs = []


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def need_tools(*tools):
    paths = {}
    for tool in tools:
        path = shutil.which(tool)
        if path is None:
            raise Failure(f"{tool} not found: CI installs it (apt: prometheus, protobuf-compiler, "
                          "protobuf-compiler-grpc, python3-grpcio)")
        paths[tool] = path
    return paths


def generate_stubs(tools, proto_root, out_dir):
    proto = "opserve/v1/opserve.proto"
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([tools["protoc"], f"-I{proto_root}", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={tools['grpc_python_plugin']}", proto],
                   check=True, timeout=60)
    sys.path.insert(0, out_dir)
    from opserve.v1 import opserve_pb2, opserve_pb2_grpc  # noqa: E402 - generated just now
    return opserve_pb2, opserve_pb2_grpc


# ---- tensors ----

def random_tensor(pb, dtype_name, shape, rng):
    n = 1
    for d in shape:
        n *= d
    if dtype_name == "FLOAT32":
        data = struct.pack(f"<{n}f", *(rng.uniform(-1, 1) for _ in range(n)))
    elif dtype_name == "BFLOAT16":
        floats = struct.pack(f"<{n}f", *(rng.uniform(-1, 1) for _ in range(n)))
        # bfloat16 is the high half of a float32.
        data = b"".join(floats[i + 2:i + 4] for i in range(0, len(floats), 4))
    elif dtype_name == "INT32":
        data = struct.pack(f"<{n}i", *(rng.randint(-100, 100) for _ in range(n)))
    elif dtype_name == "INT64":
        data = struct.pack(f"<{n}q", *(rng.randint(-100, 100) for _ in range(n)))
    else:
        raise Failure(f"no generator for dtype {dtype_name}")
    return pb.Tensor(dtype=pb.DType.Value(dtype_name), shape=list(shape), data=data)


def pick_dtype(pb, op_info, algo_info):
    names = [pb.DType.Name(d) for d in (algo_info.dtypes or op_info.dtypes)]
    return "FLOAT32" if "FLOAT32" in names or not names else names[0]


def inputs_for(model, dtype, pb, rng):
    """The op's largest small case of its table, every dimension grown by one factor (sizes that
    must agree still do) until the inputs hold about ELEMENTS elements."""
    shapes = model.small_shapes[-1]
    elements = sum(max(1, int(math.prod(s))) for s in shapes)
    rank = sum(len(s) for s in shapes)
    grow = max(1, round((ELEMENTS / elements) ** (1 / rank))) if rank else 1
    return [random_tensor(pb, dtype, tuple(d * grow for d in s), rng) for s in shapes]


def execute_request(pb, op, algorithm, tensors):
    req = pb.ExecuteRequest()
    node = req.nodes.add(id="n0", op=op, algorithm=algorithm)
    for i, t in enumerate(tensors):
        name = f"in{i}"
        req.inline_tensors[name].CopyFrom(t)
        node.inputs.add(inline_name=name)
    req.outputs.add(node="n0", return_inline=True)
    return req


# ---- Prometheus ----

def write_prometheus_config(path, rules_dir, metrics_port):
    # JSON is YAML.
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [os.path.join(os.path.abspath(rules_dir), "*.yml")],
        "scrape_configs": [{
            "job_name": JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
        }],
    }
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


class Prom:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr):
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = json.loads(http_get(url))
        if body.get("status") != "success":
            raise Failure(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    def rules_loaded(self):
        body = json.loads(http_get(f"{self.base}/api/v1/rules"))
        return [r["name"] for g in body["data"]["groups"] for r in g["rules"]]


def parse_exposition(text):
    """The samples of a Prometheus text exposition: (name, {label: value}, float value)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
        if not m:
            raise Failure(f"unparsable exposition line: {line!r}")
        labels = {k: re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1), v)
                  for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                         m.group(2) or "")}
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def sample_map(result, *labels):
    return {tuple(s["metric"].get(l, "") for l in labels): float(s["value"][1]) for s in result}


def main():
    parser = argparse.ArgumentParser(description="opserve end-to-end metrics test")
    parser.add_argument("--opserve", required=True, help="the opserve server binary")
    parser.add_argument("--proto-root", required=True, help="folder holding opserve/v1/opserve.proto")
    parser.add_argument("--rules-dir", required=True, help="deploy/prometheus/rules")
    parser.add_argument("--work-dir", help="logs and Prometheus data (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=240, help="the whole test, seconds")
    parser.add_argument("--rounds", type=int, default=3, help="Execute requests per algorithm after the first")
    parser.add_argument("--op-table", help="opserve-op-table of the server's build (default: op_table.find_tool)")
    args = parser.parse_args()
    table = op_table.OpTable(args.op_table or op_table.find_tool(args.opserve))

    deadline_all = time.monotonic() + args.timeout

    # SIGTERM (ctest's timeout) and SIGALRM (our own) unwind through `finally`.
    def bail(signum, _frame):
        raise Failure(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, bail)
    signal.signal(signal.SIGALRM, bail)
    signal.alarm(int(args.timeout) + 30)

    tools = need_tools("prometheus", "promtool", "protoc", "grpc_python_plugin")
    work = args.work_dir or tempfile.mkdtemp(prefix="opserve-e2e-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    procs = Processes()
    try:
        import grpc  # python3-grpcio
        pb, pb_grpc = generate_stubs(tools, args.proto_root, os.path.join(work, "gen"))

        # The server picks its own ports (0) and logs them: no window for another process
        # to take a port between our choosing it and the server binding it.
        opserve_log = os.path.join(work, "opserve.log")
        procs.start("opserve", [args.opserve, "--host=127.0.0.1", "--port=0", "--metrics_port=0", "--http_port=-1",
                                "--device=cpu", f"--lanes={LANES}"], opserve_log)
        ports = {}

        def logged_ports():
            procs.check_alive()
            with open(opserve_log, errors="replace") as f:
                for line in f:
                    m = re.match(r"opserve: listening on .*:(\d+)$", line.strip())
                    if m:
                        ports["grpc"] = int(m.group(1))
                    m = re.match(r"opserve: metrics on port (\d+)", line.strip())
                    if m:
                        ports["metrics"] = int(m.group(1))
            return len(ports) == 2
        wait_for("opserve's ports in its log", logged_ports, time.monotonic() + 30)
        grpc_port, metrics_port, prom_port = ports["grpc"], ports["metrics"], free_port()
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        stub = pb_grpc.OpServeStub(channel)

        def grpc_ready():
            procs.check_alive()
            grpc.channel_ready_future(channel).result(timeout=1)
            return True
        wait_for("opserve's gRPC port", grpc_ready, time.monotonic() + 30)
        wait_for("opserve's /metrics", lambda: procs.check_alive() or
                 "opserve_build_info" in http_get(f"http://127.0.0.1:{metrics_port}/metrics"),
                 time.monotonic() + 30)

        config = os.path.join(work, "prometheus.yml")
        write_prometheus_config(config, args.rules_dir, metrics_port)
        subprocess.run([tools["promtool"], "check", "config", config], check=True, timeout=60,
                       stdout=subprocess.DEVNULL)
        procs.start("prometheus", [tools["prometheus"], f"--config.file={config}",
                                   f"--storage.tsdb.path={os.path.join(work, 'prometheus-data')}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}",
                                   "--log.level=warn"],
                    os.path.join(work, "prometheus.log"))
        prom = Prom(prom_port)
        wait_for("Prometheus ready", lambda: procs.check_alive() or
                 http_get(f"{prom.base}/-/ready") is not None, time.monotonic() + 60)
        rules = prom.rules_loaded()
        for rule in (GBPS_RULE, GFLOPS_RULE, BUSY_RULE, DEVICE_GBPS_RULE,
                     "instance_device:opserve_peer_copy_gigabytes_per_second:rate5m",
                     "job:opserve_request_errors:ratio_rate5m"):
            if rule not in rules:
                raise Failure(f"recording rule {rule} not loaded; loaded: {rules}")
        wait_for("Prometheus scraping opserve (up == 1)",
                 lambda: sample_map(prom.query(f'up{{job="{JOB}"}}'), "job") == {(JOB,): 1.0},
                 time.monotonic() + 30)

        # Before any request: the kernel series of every (op, algorithm) the server's backend
        # runs exist at 0, on /metrics and in Prometheus, so that dashboards and rate() have
        # them from the first scrape (compared with ListOps's table once it has been called).
        initial = parse_exposition(http_get(f"http://127.0.0.1:{metrics_port}/metrics"))
        initial_kernels = {}  # family -> {(op, algorithm, device): value}
        for family in KERNEL_FAMILIES:
            initial_kernels[family] = {(l["op"], l["algorithm"], l["device"]): v
                                       for name, l, v in initial if name == family}
            nonzero = {k: v for k, v in initial_kernels[family].items() if v != 0}
            if not initial_kernels[family] or nonzero:
                raise Failure(f"before any request, {family} should hold a 0 for every kernel; "
                              f"has {initial_kernels[family]}")

        # Every device-level series names a device the server serves, every device has each
        # family, and every device starts serving, with no peer copy yet.
        devices = {l.get("device") for name, l, _ in initial
                   if name == "opserve_device_memory_bytes"}
        if not devices or None in devices or "" in devices:
            raise Failure(f"opserve_device_memory_bytes names devices {devices}")
        for family in DEVICE_FAMILIES:
            labelled = [l.get("device") for name, l, _ in initial if name == family]
            if set(labelled) != devices:
                raise Failure(f"{family}: device labels {sorted(map(str, set(labelled)))}, "
                              f"expected every one of {sorted(devices)} and nothing else")
        for name, l, v in initial:
            expected = {"opserve_device_serving": 1.0, "opserve_peer_copy_bytes_total": 0.0,
                        "opserve_peer_copy_seconds_total": 0.0}.get(name)
            if expected is not None and v != expected:
                raise Failure(f"{name}{{device={l['device']!r}}} is {v} at start, expected {expected}")
        wait_for("each device serving in Prometheus", lambda: sample_map(
            prom.query(f'opserve_device_serving{{job="{JOB}"}}'), "device")
            == {(d,): 1.0 for d in devices}, time.monotonic() + 30)
        log(f"devices {sorted(devices)}: every device-level family labelled, all serving")

        # One gauge per lane, at 0 while nothing runs: the lanes the server was started with.
        lanes = {l.get("lane"): v for name, l, v in initial if name == "opserve_lane_inflight"}
        if lanes != {str(i): 0.0 for i in range(LANES)}:
            raise Failure(f"opserve_lane_inflight before any request: {lanes}, expected lanes "
                          f"0..{LANES - 1} at 0")
        wait_for("each lane's gauge in Prometheus", lambda: len(
            sample_map(prom.query(f'opserve_lane_inflight{{job="{JOB}"}}'), "lane")) == LANES,
            time.monotonic() + 30)

        def kernels_at_zero_in_prometheus():
            procs.check_alive()
            seen = sample_map(prom.query(f'opserve_kernel_launches_total{{job="{JOB}"}}'),
                              "op", "algorithm", "device")
            return seen if set(seen) == set(initial_kernels["opserve_kernel_launches_total"]) \
                and not any(seen.values()) else None
        wait_for("every kernel series at 0 in Prometheus before any request",
                 kernels_at_zero_in_prometheus, time.monotonic() + 30)

        sent = collections.Counter()  # (rpc, code name) -> requests

        def call(rpc, request):
            try:
                response = getattr(stub, rpc)(request, timeout=60)
                sent[(rpc, "OK")] += 1
                return response
            except grpc.RpcError as e:
                sent[(rpc, e.code().name)] += 1
                return e

        ops = call("ListOps", pb.ListOpsRequest())
        if isinstance(ops, grpc.RpcError):
            raise Failure(f"ListOps failed: {ops}")
        by_name = {o.name: o for o in ops.ops}
        table_ops = sorted(table.names(ops.backend))
        if set(by_name) != set(table_ops):
            raise Failure(f"ListOps lists {sorted(by_name)}; the op table has {table_ops}")
        log(f"backend {ops.backend!r} device {ops.device!r}: "
            + ", ".join(f"{o.name}[{', '.join(a.name for a in o.algorithms)}]" for o in ops.ops))
        listed = {(o.name, a.name, "cpu") for o in ops.ops for a in o.algorithms}
        for family in KERNEL_FAMILIES:
            if set(initial_kernels[family]) != listed:
                raise Failure(f"before any request {family} had series for "
                              f"{sorted(initial_kernels[family])}; ListOps lists {sorted(listed)}")
        log(f"before any request: {len(listed)} kernel series at 0 in each kernel family")

        rng = random.Random(20261122)
        plan = []  # (op, requested algorithm, dtype)
        for op in table_ops:
            info = by_name[op]
            if not info.algorithms:
                raise Failure(f"ListOps lists no algorithm for {op}")
            for algo in info.algorithms:
                plan.append((op, algo.name, pick_dtype(pb, info, algo)))

        ran = set()  # (op, algorithm that actually ran)

        def run_round():
            for op, algorithm, dtype in plan:
                result = call("Execute", execute_request(pb, op, algorithm,
                                                         inputs_for(table.op(op), dtype, pb, rng)))
                if isinstance(result, grpc.RpcError):
                    raise Failure(f"Execute {op}/{algorithm} ({dtype}) failed: "
                                  f"{result.code().name}: {result.details()}")
                for node in result.nodes:
                    if node.algorithm in ("", "auto"):
                        raise Failure(f"{op}: NodeResult.algorithm is {node.algorithm!r}")
                    ran.add((node.op, node.algorithm))

        # Round 1 runs every kernel once. Prometheus has scraped each series at 0 already, so
        # rate() sees this first increase too.
        run_round()
        log(f"round 1: {len(plan)} graphs; kernels that ran: {sorted(ran)}")

        def kernels_scraped():
            procs.check_alive()
            seen = sample_map(prom.query(f'opserve_kernel_launches_total{{job="{JOB}"}}'), "op", "algorithm")
            return all(seen.get(k, 0) >= 1 for k in ran)
        wait_for("every kernel's first launch in Prometheus", kernels_scraped,
                 time.monotonic() + 30)
        time.sleep(1.5)  # one more scrape of the round-1 values

        for _ in range(args.rounds):
            run_round()
            time.sleep(1.1)  # spread the increases over several scrapes
        # A malformed graph: the op does not exist. Its code is whatever the server answers;
        # the counter must show it under that code.
        bad = call("Execute", execute_request(pb, "no_such_op", "", [random_tensor(pb, "FLOAT32", (4,), rng)]))
        if not isinstance(bad, grpc.RpcError):
            raise Failure("Execute with an unknown op succeeded")
        log(f"rounds 2..{args.rounds + 1} done; the malformed graph got {bad.code().name}; "
            f"sent {dict(sent)}")

        deadline = min(deadline_all, time.monotonic() + 60)

        def gbps_positive():
            procs.check_alive()
            gbps = sample_map(prom.query(f'{GBPS_RULE}{{job="{JOB}"}}'), "op", "algorithm")
            lacking = {k: gbps.get(k) for k in ran if not gbps.get(k, 0) > 0}
            if lacking:
                raise Failure(f"GB/s not > 0 for {lacking}")
            return gbps
        gbps = wait_for("GB/s > 0 for every op and algorithm", gbps_positive, deadline)
        for (op, algorithm), value in sorted(gbps.items()):
            log(f"  {op:10s} {algorithm:24s} {value:10.3f} GB/s")
        ran_ops = {op for op, _ in ran}
        if ran_ops != set(table_ops):
            raise Failure(f"kernels ran for {sorted(ran_ops)}, not every op {table_ops}")

        def gflops_positive():
            gflops = sample_map(prom.query(f'{GFLOPS_RULE}{{job="{JOB}", op="matmul"}}'), "algorithm")
            return gflops and all(v > 0 for v in gflops.values()) and gflops
        gflops = wait_for("matmul GFLOP/s > 0", gflops_positive, deadline)
        log(f"  matmul GFLOP/s: {gflops}")

        expected = {k: float(v) for k, v in sent.items()}

        def counts_match():
            got = sample_map(prom.query(f'sum by (rpc, code) (opserve_requests_total{{job="{JOB}"}}) > 0'),
                             "rpc", "code")
            if got != expected:
                raise Failure(f"opserve_requests_total in Prometheus {got} != sent {expected}")
            return True
        wait_for("the request counter to match the requests sent", counts_match, deadline)
        log(f"request counter matches: {expected}")

        # The server's own exposition: the same counts, and promtool's lint.
        scrape = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        direct = collections.Counter()
        for line in scrape.splitlines():
            if line.startswith("opserve_requests_total{"):
                labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
                value = float(line.rsplit(" ", 1)[1])
                if value:
                    direct[(labels["rpc"].strip('"'), labels["code"].strip('"'))] = value
        if dict(direct) != expected:
            raise Failure(f"/metrics says {dict(direct)}, sent {expected}")
        lint = subprocess.run([tools["promtool"], "check", "metrics"], input=scrape, text=True,
                              capture_output=True, timeout=60)
        if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
            raise Failure(f"promtool check metrics on opserve's /metrics:\n{lint.stdout}{lint.stderr}")

        def derived_rules():
            errors = sample_map(prom.query(f'job:opserve_request_errors:ratio_rate5m{{job="{JOB}"}}'), "job")
            p99 = sample_map(prom.query(
                f'job_rpc:opserve_request_duration_seconds:p99_rate5m{{job="{JOB}", rpc="Execute"}}'), "rpc")
            if not (errors.get((JOB,), 0) > 0 and p99.get(("Execute",), 0) > 0):
                raise Failure(f"error ratio {errors}, Execute p99 {p99}")
            return errors, p99
        errors, p99 = wait_for("error ratio > 0 and Execute p99 > 0", derived_rules, deadline)
        log(f"error ratio {errors}, Execute p99 {p99} s")

        def busy_positive():
            busy = sample_map(prom.query(f'{BUSY_RULE}{{job="{JOB}"}}'), "device")
            if not busy.get(("cpu",), 0) > 0:
                raise Failure(f"{BUSY_RULE}: {busy}")
            return busy
        log(f"busy {wait_for('the busy rule > 0 for device cpu', busy_positive, deadline)}")

        # The per-device rules: GB/s per device, and queue waits counted on the device that ran.
        def device_rules():
            gbps = sample_map(prom.query(f'{DEVICE_GBPS_RULE}{{job="{JOB}"}}'), "device")
            queued = sample_map(prom.query(
                f'sum by (device) (opserve_queue_duration_seconds_count{{job="{JOB}", rpc="Execute"}})'),
                "device")
            if not (gbps.get(("cpu",), 0) > 0 and queued.get(("cpu",), 0) > 0):
                raise Failure(f"{DEVICE_GBPS_RULE}: {gbps}; Execute queue waits by device: {queued}")
            return gbps
        log(f"GB/s by device {wait_for('the per-device GB/s rule > 0', device_rules, deadline)}")

        log(f"PASS: {len(ran)} (op, algorithm) pairs with GB/s > 0, "
            f"{int(sum(expected.values()))} requests counted exactly")
        print("1 passed, 0 failed")
        return 0
    except Exception as e:  # noqa: BLE001 - report every failure the same way, then clean up
        log(f"FAIL: {e}" if isinstance(e, Failure) else "FAIL:\n" + traceback.format_exc())
        for name, _, _, log_path in procs.procs:
            log(f"--- last lines of {name}'s log ({log_path}):\n{tail(log_path)}")
        print("0 passed, 1 failed")
        return 1
    finally:
        signal.alarm(0)
        procs.stop_all()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
