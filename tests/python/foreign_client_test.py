#!/usr/bin/python3
"""Foreign-client test: opserve driven from Python's gRPC (Debian's python3-grpcio), no C++ client.

Stubs are generated into --work-dir with protoc and grpc_python_plugin, nothing is committed.
Against a real `opserve` on a free loopback port:
  1. grpc.health.v1.Health/Check answers SERVING (hand-encoded: no health stubs needed);
  2. PutTensor streams A (64x48, in 4 KiB chunks) and B (48x32, one chunk);
  3. Execute runs row_mean(transpose(matmul(A, B))), returns the result inline and stores it;
  4. the inline result and the stored one, fetched with GetTensor, both match a float64
     reference computed here in pure Python, within a float32 error bound;
  5. error codes cross the wire: NOT_FOUND, ALREADY_EXISTS, INVALID_ARGUMENT;
  6. SIGTERM stops the server with exit status 0.
The data are examples/make_demo_inputs.py's (exact in float32). Fails, never skips, when grpc,
protoc or the plugin is missing: CI installs them.
"""

import argparse
import os
import shutil
import signal
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
from e2e_script import Failure, check, logger, report_failure, start_opserve  # noqa: E402

M, K, N = 64, 48, 32
FLOAT32_EPS = 2.0 ** -24  # unit roundoff


log = logger("foreign_client")


def find_tool(name, given):
    path = given or shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if not path:
        raise Failure(f"{name} not found (Debian: apt-get install protobuf-compiler protobuf-compiler-grpc)")
    return path


def generate_stubs(protoc, plugin, proto_root, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    proto = os.path.join(proto_root, "opserve", "v1", "opserve.proto")
    subprocess.run([protoc, f"-I{proto_root}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={plugin}", proto], check=True)
    sys.path.insert(0, out_dir)
    from opserve.v1 import opserve_pb2, opserve_pb2_grpc  # noqa: E402 - generated just now
    return opserve_pb2, opserve_pb2_grpc


def float32_bytes(rows):
    flat = [v for row in rows for v in row]
    return struct.pack(f"<{len(flat)}f", *flat)


def expect_code(grpc, code, call, what):
    try:
        call()
    except grpc.RpcError as e:
        check(e.code() == code, f"{what}: expected {code.name}, got {e.code().name}: {e.details()}")
        log(f"{what}: {code.name} as expected ({e.details()})")
        return
    raise Failure(f"{what}: expected {code.name}, the call succeeded")


def run(args, grpc, pb, pb_grpc, demo):
    log_path = os.path.join(args.work_dir, "opserve.log")
    server, port = start_opserve(args.opserve, args.device, log_path)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            grpc.channel_ready_future(channel).result(timeout=args.timeout)
        except grpc.FutureTimeoutError:
            raise Failure(f"the server did not listen within {args.timeout} s (exit {server.poll()})")
        exercise(channel, grpc, pb, pb_grpc, demo)
        channel.close()
        server.send_signal(signal.SIGTERM)
        check(server.wait(timeout=args.timeout) == 0, f"opserve exited {server.returncode} on SIGTERM")
        log("SIGTERM: opserve exited 0")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        with open(log_path) as f:
            log("server log:\n" + f.read().rstrip())


def exercise(channel, grpc, pb, pb_grpc, demo):
    # 1. Health: an empty HealthCheckRequest; the response's field 1 (status) is 1 = SERVING.
    check_health = channel.unary_unary("/grpc.health.v1.Health/Check",
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
    health = check_health(b"", timeout=10)
    check(health == b"\x08\x01", f"Health/Check: expected SERVING (08 01), got {health.hex()}")
    log("health: SERVING")

    stub = pb_grpc.OpServeStub(channel)
    a, b = demo.demo_matrices()

    # 2. Uploads: a header, then chunks (A in many, B in one).
    def put(name, rows, chunk, overwrite=True):
        data = float32_bytes(rows)

        def requests():
            yield pb.PutTensorRequest(header=pb.PutTensorHeader(
                name=name, dtype=pb.FLOAT32, shape=[len(rows), len(rows[0])], overwrite=overwrite))
            for offset in range(0, len(data), chunk):
                yield pb.PutTensorRequest(chunk=data[offset:offset + chunk])
        return stub.PutTensor(requests(), timeout=30)

    for name, rows, chunk in (("py_A", a, 4096), ("py_B", b, 1 << 20)):
        info = put(name, rows, chunk).info
        check(list(info.shape) == [len(rows), len(rows[0])] and info.bytes == 4 * len(rows) * len(rows[0]),
              f"PutTensor {name}: unexpected info {info}")
        log(f"put {name}: shape {list(info.shape)}, {info.bytes} bytes on {info.device}")
    listed = {t.name: t for t in stub.ListTensors(pb.ListTensorsRequest(), timeout=10).tensors}
    check({"py_A", "py_B"} <= set(listed), f"ListTensors lacks py_A/py_B: {sorted(listed)}")

    # 3. Execute: returned inline and stored.
    request = pb.ExecuteRequest(
        nodes=[pb.Node(id="ab", op="matmul", inputs=[pb.Input(stored="py_A"), pb.Input(stored="py_B")]),
               pb.Node(id="ab_t", op="transpose", inputs=[pb.Input(node="ab")]),
               pb.Node(id="mean", op="row_mean", inputs=[pb.Input(node="ab_t")])],
        outputs=[pb.OutputSpec(node="mean", return_inline=True, store_as="py_mean", overwrite=True)])
    response = stub.Execute(request, timeout=60)
    check([n.id for n in response.nodes] == ["ab", "ab_t", "mean"],
          f"node results: {[n.id for n in response.nodes]}")
    for node, shape in zip(response.nodes, ([M, N], [N, M], [N])):
        check(list(node.shape) == shape, f"node {node.id}: shape {list(node.shape)}, expected {shape}")
        check(node.algorithm and node.algorithm != "auto", f"node {node.id}: algorithm '{node.algorithm}'")
        log(f"node {node.id}: {node.op} by {node.algorithm}, {node.kernel_us:.1f} us")
    check(len(response.outputs) == 1 and response.outputs[0].node == "mean", "one inline output, 'mean'")
    inline = response.outputs[0].tensor
    check(inline.dtype == pb.FLOAT32 and list(inline.shape) == [N], f"inline output {inline.dtype} {list(inline.shape)}")

    # 4. The stored copy, downloaded: the info first, then chunks.
    messages = list(stub.GetTensor(pb.GetTensorRequest(name="py_mean"), timeout=30))
    check(messages and messages[0].WhichOneof("kind") == "info", "GetTensor: the info comes first")
    check(all(m.WhichOneof("kind") == "chunk" for m in messages[1:]), "GetTensor: then only chunks")
    stored = b"".join(m.chunk for m in messages[1:])
    check(stored == inline.data, "the stored result differs from the returned one")

    reference, scales = demo.row_mean_transpose_matmul(a, b)
    got = struct.unpack(f"<{N}f", inline.data)
    worst = 0.0
    for j, (value, want, scale) in enumerate(zip(got, reference, scales)):
        # Rounding error of a float32 K-term dot product then an M-term mean, in any order:
        # at most (K + M + 2) u times the same computed on absolute values; twice that for slack.
        tolerance = 2 * (K + M + 2) * FLOAT32_EPS * scale + 1e-7
        check(value == value, f"output[{j}] is NaN")
        check(abs(value - want) <= tolerance,
              f"output[{j}] = {value!r}, reference {want!r}, off by {abs(value - want):.3g} > {tolerance:.3g}")
        worst = max(worst, abs(value - want) / tolerance)
    log(f"result matches the float64 reference: worst error {worst:.3f} of the tolerance")

    # 5. Error codes cross the wire with their meaning.
    expect_code(grpc, grpc.StatusCode.NOT_FOUND,
                lambda: list(stub.GetTensor(pb.GetTensorRequest(name="py_missing"), timeout=10)),
                "GetTensor of a missing tensor")
    expect_code(grpc, grpc.StatusCode.ALREADY_EXISTS, lambda: put("py_A", a, 4096, overwrite=False),
                "PutTensor over an existing name")
    bad = pb.ExecuteRequest(nodes=[pb.Node(id="x", op="matmul", inputs=[pb.Input(stored="py_A"),
                                                                         pb.Input(stored="py_A")])],
                            outputs=[pb.OutputSpec(node="x", return_inline=True)])
    expect_code(grpc, grpc.StatusCode.INVALID_ARGUMENT, lambda: stub.Execute(bad, timeout=10),
                "matmul of mismatched shapes")

    for name in ("py_A", "py_B", "py_mean"):
        stub.DeleteTensor(pb.DeleteTensorRequest(name=name), timeout=10)
    check(not stub.ListTensors(pb.ListTensorsRequest(), timeout=10).tensors, "tensors left after deletes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opserve", required=True, help="the server binary")
    parser.add_argument("--proto-root", required=True, help="directory holding opserve/v1/opserve.proto")
    parser.add_argument("--examples", required=True, help="the examples/ directory (demo data)")
    parser.add_argument("--work-dir", required=True, help="for generated stubs and the server log")
    parser.add_argument("--device", default="auto", help="the server's --device")
    parser.add_argument("--protoc", default=None)
    parser.add_argument("--grpc-python-plugin", default=None)
    parser.add_argument("--timeout", type=float, default=60, help="seconds for start-up and stop")
    args = parser.parse_args()
    try:
        try:
            import grpc
            import google.protobuf  # noqa: F401 - the generated stubs need it
        except ImportError as e:
            raise Failure(f"{e}: run with Debian's /usr/bin/python3 and python3-grpcio, python3-protobuf")
        os.makedirs(args.work_dir, exist_ok=True)
        pb, pb_grpc = generate_stubs(find_tool("protoc", args.protoc),
                                     find_tool("grpc_python_plugin", args.grpc_python_plugin),
                                     args.proto_root, os.path.join(args.work_dir, "gen"))
        sys.path.insert(0, args.examples)
        import make_demo_inputs as demo  # noqa: E402 - the shared demo data
        run(args, grpc, pb, pb_grpc, demo)
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        report_failure(log, e)
        return 1
    log("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
