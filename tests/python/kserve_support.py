"""What kserve_test.py needs that is not a test: stubs generated at test time, a real server,
POSIX shared memory, datatype conversions and a numpy tolerance check. Written from
proto/inference/grpc_service.proto, proto/opserve/v1/opserve.proto and docs/API.md's "Open
Inference Protocol (KServe v2)" section alone; what it needs of the op table is in op_table.py.
Not a test itself.
"""

import mmap
import os
import shutil
import subprocess
import sys
import unittest
import xml.etree.ElementTree as ET

import grpc
import numpy as np

import client_support

STARTUP_SECONDS = 60
MiB = 1 << 20
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
K = KG = O = OG = R = RG = None  # the generated modules (generate_stubs): inference, opserve.v1, reflection
FP32_U = 2.0 ** -24

# The part of grpc/reflection/v1alpha/reflection.proto a list_services call needs (field numbers
# as published); python3-grpcio has no grpc_reflection module.
REFLECTION_PROTO = """syntax = "proto3";
package grpc.reflection.v1alpha;
service ServerReflection {
  rpc ServerReflectionInfo(stream ServerReflectionRequest) returns (stream ServerReflectionResponse);
}
message ServerReflectionRequest {
  string host = 1;
  oneof message_request { string file_containing_symbol = 4; string list_services = 7; }
}
message ServiceResponse { string name = 1; }
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ErrorResponse { int32 error_code = 1; string error_message = 2; }
message ServerReflectionResponse {
  string valid_host = 1;
  ServerReflectionRequest original_request = 2;
  oneof message_response { ListServiceResponse list_services_response = 6; ErrorResponse error_response = 7; }
}
"""


def _tool(name):
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if not path:
        raise RuntimeError(f"{name} not found (Debian: protobuf-compiler protobuf-compiler-grpc)")
    return path


class RecordingResult(unittest.TextTestResult):
    """unittest's text result that also keeps the tests that passed, for write_junit_xml."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed.append(test)


def write_junit_xml(result, suite, path):
    """One <testcase> per test, as gtest's XML has them: a <failure> for a failure or error (of the
    test or any of its subtests), <skipped> for a skip; nothing for a pass."""
    cases = {}
    for test in result.passed:
        cases.setdefault(test.id(), None)
    for test, reason in result.skipped:
        cases[test.id()] = ("skipped", reason)
    for test, trace in result.failures + result.errors:
        cases[getattr(test, "test_case", test).id()] = ("failure", trace)  # a subtest: its test
    root = ET.Element("testsuites")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)))
    for test_id, outcome in sorted(cases.items()):
        classname, _, name = test_id.rpartition(".")
        case = ET.SubElement(node, "testcase", classname=classname, name=name)
        if outcome is not None:
            ET.SubElement(case, outcome[0], message=outcome[1].splitlines()[-1] if outcome[1] else "").text = outcome[1]
    ET.ElementTree(root).write(path, encoding="unicode")


def generate_stubs(proto_root, out_dir):
    """(kserve pb2, kserve grpc, opserve pb2, opserve grpc, reflection pb2, reflection grpc),
    generated with protoc and grpc_python_plugin into out_dir."""
    shutil.rmtree(out_dir, ignore_errors=True)
    refl_root = os.path.join(out_dir, "refl_src")
    os.makedirs(os.path.join(refl_root, "kv_reflection"))
    with open(os.path.join(refl_root, "kv_reflection", "reflection.proto"), "w") as f:
        f.write(REFLECTION_PROTO)
    protoc, plugin = _tool("protoc"), _tool("grpc_python_plugin")
    for root, proto in ((proto_root, "inference/grpc_service.proto"),
                        (proto_root, "opserve/v1/opserve.proto"),
                        (refl_root, "kv_reflection/reflection.proto")):
        subprocess.run([protoc, f"-I{root}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                        f"--plugin=protoc-gen-grpc_python={plugin}", os.path.join(root, proto)], check=True)
    sys.path.insert(0, out_dir)
    from inference import grpc_service_pb2, grpc_service_pb2_grpc  # noqa: E402 - generated now
    from opserve.v1 import opserve_pb2, opserve_pb2_grpc  # noqa: E402
    from kv_reflection import reflection_pb2, reflection_pb2_grpc  # noqa: E402
    global K, KG, O, OG, R, RG
    K, KG, O, OG, R, RG = (grpc_service_pb2, grpc_service_pb2_grpc, opserve_pb2, opserve_pb2_grpc,
                           reflection_pb2, reflection_pb2_grpc)
    return K, KG, O, OG, R, RG


def device():
    """The backend the servers run on: $OPSERVE_TEST_DEVICE (the GPU suite sets cuda), else cpu."""
    return os.environ.get("OPSERVE_TEST_DEVICE", "cpu")


def Server(binary, directory, name, extra_args=()):
    """opserve --device=device() on a free loopback port (client_support's launcher), its log in
    directory/name.log; `target` is its address, stop() drains it. The GPU suite's capped mode
    sets $OPSERVE_TEST_MAX_COMPUTE_CAPABILITY, passed on as --max_compute_capability."""
    os.makedirs(directory, exist_ok=True)
    cap = os.environ.get("OPSERVE_TEST_MAX_COMPUTE_CAPABILITY")
    args = (*extra_args, f"--max_compute_capability={cap}") if cap else tuple(extra_args)
    return client_support.Server(directory, args, binary=binary, name=name, device=device())


# ---- messages and a client ----

def P(value):
    """An InferParameter of value's type."""
    if isinstance(value, bool):
        return K.InferParameter(bool_param=value)
    if isinstance(value, int):
        return K.InferParameter(int64_param=value)
    if isinstance(value, float):
        return K.InferParameter(double_param=value)
    return K.InferParameter(string_param=value)


def In(name, datatype, shape, data=None, typed=False, **params):
    """(input tensor message, raw bytes or None). typed: data goes in `contents` instead."""
    t = K.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(shape),
                                             parameters={k: P(v) for k, v in params.items()})
    if data is None or not typed:
        return t, (None if data is None else np.ascontiguousarray(data).tobytes())
    flat = np.asarray(data).ravel().tolist()
    field = {"FP32": "fp32_contents", "INT32": "int_contents", "INT64": "int64_contents"}[datatype]
    getattr(t.contents, field).extend(flat)
    return t, None


def Out(name, **params):
    return K.ModelInferRequest.InferRequestedOutputTensor(name=name, parameters={k: P(v) for k, v in params.items()})


def request(model, inputs, outputs=None, version="", **params):
    return K.ModelInferRequest(model_name=model, model_version=version, inputs=[t for t, _ in inputs],
                               outputs=outputs or [], parameters={k: P(v) for k, v in params.items()},
                               raw_input_contents=[raw for _, raw in inputs if raw is not None])


class Client:
    """Both services' stubs on one channel, every call with this tenant's token (if any)."""

    def __init__(self, target, token=None):
        self.channel = grpc.insecure_channel(target, options=UNLIMITED)
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_SECONDS)
        self.k, self.o = KG.GRPCInferenceServiceStub(self.channel), OG.OpServeStub(self.channel)
        self.md = [("authorization", f"Bearer {token}")] if token else None

    def __getattr__(self, rpc):  # client.ModelInfer(req) -> either service, with the token
        stub = self.k if hasattr(self.k, rpc) else self.o
        method = getattr(stub, rpc)
        return lambda req, **kw: method(req, metadata=self.md, timeout=kw.pop("timeout", 120), **kw)

    def put(self, name, datatype, array, overwrite=False):
        dtype = {"FP32": O.FLOAT32, "INT32": O.INT32, "INT64": O.INT64, "BF16": O.BFLOAT16}[datatype]
        data = np.ascontiguousarray(array).tobytes()

        def stream():
            yield O.PutTensorRequest(header=O.PutTensorHeader(name=name, dtype=dtype, shape=list(array.shape),
                                                              overwrite=overwrite))
            for i in range(0, len(data), 65536):
                yield O.PutTensorRequest(chunk=data[i:i + 65536])
        return self.PutTensor(stream())

    def get(self, name):
        messages = list(self.GetTensor(O.GetTensorRequest(name=name)))
        info = messages[0].info
        return info, b"".join(m.chunk for m in messages[1:])

    def state(self):
        """What a failed request must leave as it was: regions, stored tensors, saved graphs."""
        regions = {n: (r.key, r.offset, r.byte_size) for n, r in
                   self.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest()).regions.items()}
        tensors = sorted((t.name, tuple(t.shape), t.dtype) for t in self.ListTensors(O.ListTensorsRequest()).tensors)
        graphs = sorted(g.name for g in self.ListGraphs(O.ListGraphsRequest()).graphs)
        return regions, tensors, graphs


class Shm:
    """A POSIX shared-memory object made as shm_open would ('/dev/shm/NAME', key '/NAME'), mapped
    here; `array(dtype, shape, offset)` views its bytes."""

    def __init__(self, name, size):
        self.key = "/" + name
        self.path = "/dev/shm/" + name
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size

    def array(self, dtype, shape, offset=0):
        count = int(np.prod(shape))
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=offset).reshape(shape)

    def close(self):
        try:
            self.map.close()
        except BufferError:  # a numpy view still alive: the unlink below is what matters
            pass
        if os.path.exists(self.path):
            os.unlink(self.path)


# ---- datatypes ----

NUMPY = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BF16": np.uint16}
KSERVE_OF_DTYPE = {1: "FP32", 2: "INT32", 3: "INT64", 4: "BF16"}  # opserve.v1.DType numbers
DTYPE_OF_KSERVE = {"FP32": "FLOAT32", "INT32": "INT32", "INT64": "INT64", "BF16": "BFLOAT16"}  # their names


def to_bf16_bits(x):
    """float32 -> bfloat16 bits, rounded to nearest even."""
    a = np.asarray(x, dtype=np.float32)
    # At least 1-D while shifting: a 0-d array's arithmetic gives numpy scalars, whose uint64 and
    # Python-int operands promote to float64, which cannot shift.
    bits = np.atleast_1d(a).view(np.uint32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return rounded.astype(np.uint16).reshape(a.shape)


def random_input(rng, datatype, shape, big_ints=False):
    """Fresh random data of a datatype, as it goes on the wire (BF16: uint16 bits)."""
    if datatype == "FP32":
        return rng.uniform(-1, 1, shape).astype(np.float32)
    if datatype == "BF16":
        return to_bf16_bits(rng.uniform(-1, 1, shape))
    if datatype == "INT32":
        bound = 2 ** 30 if big_ints else 1000
        return rng.integers(-bound, bound, shape, dtype=np.int32)
    bound = 2 ** 62 if big_ints else 10 ** 6
    return rng.integers(-bound, bound, shape, dtype=np.int64)


def decode(datatype, shape, raw):
    return np.frombuffer(raw, dtype=NUMPY[datatype]).reshape(shape)


def check_close(testcase, what, datatype_in, out_datatype, got, want, length, absref, input_rounding=0.0):
    """Integers and transposes exact. Floats element by element: |got - want| <= rtol * absref
    (the reference on absolute values; want itself where the inputs are not negative), rtol =
    max(1e-5, 8 sqrt(length) u) for float32 accumulation over `length` terms, plus 1e-2 |want|
    for BF16 inputs, plus 2 input_rounding absref where the kernel rounds both factors of each
    product (TF32 tensor cores). NaN or Inf never passes where the reference is finite."""
    testcase.assertEqual(tuple(got.shape), tuple(want.shape), f"{what}: shape")
    if out_datatype in ("INT32", "INT64", "BF16") or want.dtype != np.float64:
        testcase.assertTrue(np.array_equal(got, want), f"{what}: not exact:\n got {got}\nwant {want}")
        return
    got64 = got.astype(np.float64)
    finite = np.isfinite(want)
    testcase.assertTrue(np.all(np.isfinite(got64[finite])), f"{what}: non-finite output {got}")
    rtol = max(1e-5, 8 * np.sqrt(length) * FP32_U) + 2 * input_rounding
    bound = rtol * (np.abs(want) if absref is None else absref) + (1e-2 * np.abs(want) if datatype_in == "BF16" else 0)
    excess = np.abs(got64 - want) - bound - 1e-30
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else ()
    testcase.assertTrue(excess.size == 0 or excess[worst] <= 0,
                        f"{what}: element {worst} is {got64[worst]!r}, reference {want[worst]!r}, "
                        f"off by {abs(got64[worst] - want[worst]):.3g} > {bound[worst]:.3g}")
