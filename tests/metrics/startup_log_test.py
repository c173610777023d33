#!/usr/bin/python3
"""The real opserve (CPU backend) from the outside: its /metrics before any call, and
--log_requests.

1. A server with --log_requests and bearer tokens: a real HTTP GET of /metrics before any call
   finds opserve_requests_total at 0 for every code of every method of both services, as the
   generated service descriptors list them (no list kept here), and a request-duration series
   for each; the queue-time histogram exists for the RPCs that queue on a device (Execute,
   ExecuteStream, ModelInfer, ModelStreamInfer) and for no other.
2. Calls over gRPC (stubs generated here with protoc and grpc_python_plugin), some that succeed
   and some that fail; the server's log then has one request line per call, with its method,
   model name, tenant, code, duration, request and response bytes and peer, and neither the
   token nor the tensor's bytes appear anywhere in the log.
3. A server without the flag logs no request line for the same kind of call.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_test import (Failure, Processes, generate_stubs, http_get, log, need_tools,  # noqa: E402
                      parse_exposition, wait_for)

TOKEN = "tok-Zq81-never-logged"
# The tensor's bytes: a pattern that reads as text, so that the log check finds any echo of it.
MARKER = b"TENSORBYTES-7f3a"
DATA = MARKER * (96 * 1024 // len(MARKER))  # 96 KiB
QUEUED = {"Execute", "ExecuteStream", "ModelInfer", "ModelStreamInfer"}
# A name chosen to break a log line: escaped, and cut at 128 characters.
HOSTILE = "evil name\nopserve: request method=Forged" + "x" * 300
HOSTILE_LOGGED = ("evil\\x20name\\x0aopserve:\\x20request\\x20method=Forged"
                  + "x" * (128 - len("evil name\nopserve: request method=Forged")) + "...")
LINE = re.compile(r"^opserve: request (.*)$")
CODES = 17


def start(procs, binary, work, name, extra):
    path = os.path.join(work, f"{name}.log")
    procs.start(name, [binary, "--host=127.0.0.1", "--port=0", "--metrics_port=0", "--http_port=-1", "--device=cpu",
                       *extra], path)
    ports = {}

    def logged_ports():
        procs.check_alive()
        with open(path, errors="replace") as f:
            for line in f:
                if m := re.match(r"opserve: listening on .*:(\d+)$", line.strip()):
                    ports["grpc"] = int(m.group(1))
                if m := re.match(r"opserve: metrics on port (\d+)", line.strip()):
                    ports["metrics"] = int(m.group(1))
        return len(ports) == 2
    wait_for(f"{name}'s ports in its log", logged_ports, time.monotonic() + 30)
    return path, ports["grpc"], ports["metrics"]


def request_lines(path):
    with open(path, errors="replace") as f:
        text = f.read()
    lines = []
    for line in text.splitlines():
        if m := LINE.match(line):
            lines.append(dict(field.split("=", 1) for field in m.group(1).split(" ")))
    return text, lines


def check_startup_series(text, services):
    samples = parse_exposition(text)
    requests = {(labels["rpc"], labels["code"]): value
                for name, labels, value in samples if name == "opserve_requests_total"}
    durations = {labels["rpc"] for name, labels, _ in samples
                 if name == "opserve_request_duration_seconds_count"}
    queues = {labels["rpc"] for name, labels, _ in samples
              if name == "opserve_queue_duration_seconds_count"}
    methods = [m.name for service in services for m in service.methods]
    if len(methods) < 20:
        raise Failure(f"the descriptors list only {methods}")
    for method in methods:
        codes = {code for (rpc, code) in requests if rpc == method}
        if len(codes) != CODES:
            raise Failure(f"{method}: {len(codes)} code series at start-up, not {CODES}: {codes}")
        if method not in durations:
            raise Failure(f"{method}: no opserve_request_duration_seconds series at start-up")
    busy = {k: v for k, v in requests.items() if v != 0}
    if busy:
        raise Failure(f"requests counted before any call: {busy}")
    if queues != QUEUED:
        raise Failure(f"queue-time series for {sorted(queues)}, expected {sorted(QUEUED)}")
    log(f"start-up series: {len(methods)} RPCs x {CODES} codes, queues for {sorted(queues)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opserve", required=True)
    parser.add_argument("--proto-root", required=True)
    parser.add_argument("--work-dir")
    parser.add_argument("--timeout", type=float, default=90)
    args = parser.parse_args()

    def bail(signum, _frame):
        raise Failure(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, bail)
    signal.signal(signal.SIGALRM, bail)
    signal.alarm(int(args.timeout))

    tools = need_tools("protoc", "grpc_python_plugin")
    work = args.work_dir or tempfile.mkdtemp(prefix="opserve-log-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    gen = os.path.join(work, "gen")
    pb, pb_grpc = generate_stubs(tools, args.proto_root, gen)
    subprocess.run([tools["protoc"], f"-I{args.proto_root}", f"--python_out={gen}",
                    f"--grpc_python_out={gen}",
                    f"--plugin=protoc-gen-grpc_python={tools['grpc_python_plugin']}",
                    "inference/grpc_service.proto"], check=True, timeout=60)
    from inference import grpc_service_pb2 as ipb, grpc_service_pb2_grpc as ipb_grpc  # noqa: E402
    import grpc  # python3-grpcio

    tokens = os.path.join(work, "tokens")
    with open(tokens, "w") as f:
        f.write(f"alice:{TOKEN}\n")
    procs = Processes()
    try:
        path, grpc_port, metrics_port = start(procs, args.opserve, work, "logged",
                                              ["--log_requests", f"--auth_tokens_file={tokens}"])
        check_startup_series(http_get(f"http://127.0.0.1:{metrics_port}/metrics"),
                             [pb.DESCRIPTOR.services_by_name["OpServe"],
                              ipb.DESCRIPTOR.services_by_name["GRPCInferenceService"]])

        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        stub, oip = pb_grpc.OpServeStub(channel), ipb_grpc.GRPCInferenceServiceStub(channel)
        auth = [("authorization", f"Bearer {TOKEN}")]
        header = pb.PutTensorHeader(name="t", dtype=pb.FLOAT32, shape=[len(DATA) // 4])
        put = [pb.PutTensorRequest(header=header), pb.PutTensorRequest(chunk=DATA)]
        _, put_call = stub.PutTensor.with_call(iter(put), metadata=auth, timeout=30)
        # The request log is one interceptor of several: the others still run beside it.
        if not any(k == "x-opserve-replica" for k, _ in put_call.initial_metadata()):
            raise Failure("with --log_requests the answers lost their x-opserve-replica header")
        got = b"".join(r.chunk for r in stub.GetTensor(pb.GetTensorRequest(name="t"),
                                                       metadata=auth, timeout=30))
        if got != DATA:
            raise Failure("GetTensor did not return what PutTensor stored")
        expected = [("PutTensor", "OK", "alice", "-"), ("GetTensor", "OK", "alice", "-")]
        # (call, the line it should log: method, code, tenant, name)
        calls = [
            (lambda: list(stub.GetTensor(pb.GetTensorRequest(name="nope"), metadata=auth,
                                         timeout=30)), ("GetTensor", "NOT_FOUND", "alice", "-")),
            (lambda: stub.ListOps(pb.ListOpsRequest(), timeout=30),
             ("ListOps", "UNAUTHENTICATED", "-", "-")),
            (lambda: oip.ModelMetadata(ipb.ModelMetadataRequest(name="no_model"), metadata=auth,
                                       timeout=30),
             ("ModelMetadata", "NOT_FOUND", "alice", "no_model")),
            (lambda: oip.ModelMetadata(ipb.ModelMetadataRequest(name=HOSTILE), metadata=auth,
                                       timeout=30),
             ("ModelMetadata", "NOT_FOUND", "alice", HOSTILE_LOGGED)),
            (lambda: oip.ServerLive(ipb.ServerLiveRequest(), timeout=30),
             ("ServerLive", "OK", "-", "-")),
        ]
        for call, line in calls:
            try:
                call()
                got_code = "OK"
            except grpc.RpcError as e:
                got_code = e.code().name
            if got_code != line[1]:
                raise Failure(f"{line[0]} answered {got_code}, expected {line[1]}")
            expected.append(line)

        lines = wait_for("one request line per call",
                         lambda: (lambda l: l if len(l) >= len(expected) else None)(
                             request_lines(path)[1]), time.monotonic() + 20)
        text, lines = request_lines(path)
        if len(lines) != len(expected):
            raise Failure(f"{len(lines)} request lines for {len(expected)} calls:\n{text}")
        for want, line in zip(expected, lines):
            seen = (line.get("method"), line.get("code"), line.get("tenant"), line.get("name"))
            if seen != want:
                raise Failure(f"request line {line}, expected {want}")
            if not re.fullmatch(r"ipv4:127\.0\.0\.1:\d+", line.get("peer", "")):
                raise Failure(f"peer {line.get('peer')!r}")
            if float(line["ms"]) < 0 or int(line["request_bytes"]) < 0:
                raise Failure(f"bad numbers in {line}")
        if int(lines[0]["request_bytes"]) < len(DATA):
            raise Failure(f"PutTensor's request_bytes {lines[0]['request_bytes']} < {len(DATA)}")
        if int(lines[1]["response_bytes"]) < len(DATA):
            raise Failure(f"GetTensor's response_bytes {lines[1]['response_bytes']} < {len(DATA)}")
        if TOKEN in text or MARKER.decode() in text:
            raise Failure("the token or the tensor's bytes reached the log")
        log(f"{len(lines)} request lines as expected")
        channel.close()

        quiet, grpc_port, _ = start(procs, args.opserve, work, "quiet", [])
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=30)
            pb_grpc.OpServeStub(ch).ListOps(pb.ListOpsRequest(), timeout=30)
        if request_lines(quiet)[1]:
            raise Failure(f"request lines without --log_requests:\n{request_lines(quiet)[0]}")
        log("no request lines without the flag")
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
