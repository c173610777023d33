"""Triton's own Python client, tritonclient, unchanged against a real opserve on its CPU backend:
tritonclient.http on the HTTP/REST port and tritonclient.grpc on the gRPC port.

tritonclient is on Python's package index, not in Debian: the suite imports it from
$OPSERVE_TRITONCLIENT_PATH (a directory holding the tritonclient package, its libcshm.so built
and, for tritonclient.grpc, its service_pb2 modules generated from proto/inference), else from
the normal path. Where a side cannot be imported, each of its cases is reported skipped with the
import error, and a run where every case skipped exits 77 (ctest's SKIP_RETURN_CODE).

Each case runs the client's public calls: health, server and model metadata, model config, the
repository index, inference on every op of the op table and each of its datatypes (HTTP: JSON
and binary tensor data), the algorithm parameter, errors (an InferenceServerException whose
message names the culprit), system shared memory through tritonclient.utils.shared_memory, and
statistics that count exactly the requests sent. Results are checked against the op table's CPU
reference (op_table.py).
"""

import argparse
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
import op_table  # noqa: E402
from http_support import API, OIP, Server  # noqa: E402

SKIPPED = 77
ARGS = None
TABLE = None

if os.environ.get("OPSERVE_TRITONCLIENT_PATH"):
    sys.path.insert(0, os.environ["OPSERVE_TRITONCLIENT_PATH"])


def _import(name):
    """(module, None) or (None, why it cannot be imported)."""
    try:
        return __import__(name, fromlist=["_"]), None
    except Exception as e:  # a missing dependency raises RuntimeError as well as ImportError
        return None, f"{name} cannot be imported ({type(e).__name__}: {e}); set " \
                     f"OPSERVE_TRITONCLIENT_PATH to a directory holding tritonclient"


httpclient, HTTP_MISSING = _import("tritonclient.http")
grpcclient, GRPC_MISSING = _import("tritonclient.grpc")
shm, SHM_MISSING = _import("tritonclient.utils.shared_memory")
if httpclient or grpcclient:
    from tritonclient.utils import InferenceServerException


def bf16_bytes(a):
    """float32 values, each a bfloat16 (low half zero), as the bfloat16 bytes."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def random_tensor(rng, datatype, shape):
    if datatype in ("FP32", "BF16"):
        a = rng.uniform(-4, 4, shape).astype(np.float32)
        if datatype == "BF16":  # tritonclient sends a bfloat16 input as float32 truncated
            a = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        return a
    return rng.integers(-100, 101, shape).astype(np.int32 if datatype == "INT32" else np.int64)


def wire_bytes(datatype, a):
    return bf16_bytes(a) if datatype == "BF16" else np.ascontiguousarray(a).tobytes()


class Cases:
    """The cases, for either client; subclasses say which and how its answers read."""

    client_module = None

    @classmethod
    def setUpClass(cls):
        cls.server = Server(ARGS.opserve, os.path.join(ARGS.work_dir, cls.__name__))

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        if status != 0:
            raise AssertionError(f"opserve exited {status}:\n{cls.server.log()}")

    def setUp(self):
        self.c = self.connect()
        self.addCleanup(self.c.close)
        self.rng = np.random.default_rng(11)

    def assertRaisesNaming(self, status, call, *culprits):
        with self.assertRaises(InferenceServerException) as caught:
            call()
        e = caught.exception
        self.assertEqual(e.status(), status, e.message())
        for culprit in culprits:
            self.assertIn(culprit, e.message())

    def op_inputs(self, name, datatype):
        """[(input name, datatype, array)] for the op's last small case, the names from the model's
        metadata."""
        names = [i["name"] for i in self.metadata(name)["inputs"]]
        shapes = TABLE.op(name).small_shapes[-1]
        self.assertEqual(len(names), len(shapes))
        return [(n, datatype, random_tensor(self.rng, datatype, s)) for n, s in zip(names, shapes)]

    def infer(self, name, inputs, binary=True, outputs=None, **kwargs):
        m = self.client_module
        wire = []
        for n, datatype, a in inputs:
            i = m.InferInput(n, list(a.shape), datatype)
            # tritonclient.http refuses to send BF16 as JSON.
            binary_input = binary or datatype == "BF16"
            i.set_data_from_numpy(a, **({"binary_data": binary_input} if m is httpclient else {}))
            wire.append(i)
        return self.c.infer(name, wire, outputs=outputs, **kwargs)

    def check_result(self, name, inputs, result):
        """The result's output y against the CPU reference of the algorithm it names."""
        datatype, y = self.output_datatype(result, "y"), result.as_numpy("y")
        self.assertIsNotNone(y)
        raw = bf16_bytes(y) if datatype == "BF16" else y.tobytes()
        ok, why = TABLE.check(name, self.algorithm(result),
                              [(API[d], a.shape, wire_bytes(d, a)) for _, d, a in inputs],
                              (API[datatype], y.shape, raw))
        self.assertTrue(ok, f"{name}: {why}")

    def test_health_and_server_metadata(self):
        self.assertTrue(self.c.is_server_live())
        self.assertTrue(self.c.is_server_ready())
        meta = self.server_metadata()
        self.assertEqual(meta["name"], "opserve")
        self.assertIn("system_shared_memory", meta["extensions"])

    def test_model_metadata_config_readiness_and_index(self):
        for name, op in TABLE.ops.items():
            with self.subTest(op=name):
                self.assertTrue(self.c.is_model_ready(name))
                self.assertTrue(self.c.is_model_ready(name, "1"))
                meta = self.metadata(name)
                self.assertEqual(meta["name"], name)
                self.assertEqual(len(meta["inputs"]), op.arity)
                self.assertEqual([o["name"] for o in meta["outputs"]], ["y"])
                config = self.config(name)
                self.assertEqual(config["name"], name)
                self.assertEqual([i["name"] for i in config["input"]], [i["name"] for i in meta["inputs"]])
        # A model or version the server does not have is not ready, on both ports as in Triton.
        self.assertFalse(self.c.is_model_ready("no_such_model"))
        self.assertFalse(self.c.is_model_ready("row_mean", "2"))
        index = self.repository_index()
        self.assertEqual({m["name"] for m in index}, TABLE.names("cpu"))
        self.assertTrue(all(m["state"] == "READY" for m in index))
        self.assertRaisesNaming(self.NOT_FOUND, lambda: self.c.get_model_metadata("no_such_model"),
                                "no_such_model")

    def test_infer_every_op_and_datatype(self):
        for name, op in TABLE.ops.items():
            for datatype in (OIP[d] for d in op.dtypes):
                for binary in self.encodings(datatype):
                    with self.subTest(op=name, datatype=datatype, binary=binary):
                        inputs = self.op_inputs(name, datatype)
                        result = self.infer(name, inputs, binary, self.outputs(datatype, binary),
                                            request_id="r1")
                        self.assertEqual(self.response(result)["model_name"], name)
                        self.assertEqual(self.response(result)["id"], "r1")
                        self.check_result(name, inputs, result)

    def test_algorithm_parameter(self):
        for name, op in TABLE.ops.items():
            inputs = self.op_inputs(name, OIP[op.dtypes[0]])
            for row in op.rows("cpu"):
                with self.subTest(op=name, algorithm=row["name"]):
                    result = self.infer(name, inputs, parameters={"algorithm": row["name"]})
                    self.assertEqual(self.algorithm(result), row["name"])
                    self.check_result(name, inputs, result)
            self.assertRaisesNaming(self.INVALID, lambda: self.infer(
                name, inputs, parameters={"algorithm": "no_such_algorithm"}), "no_such_algorithm")

    def test_bad_requests_raise_naming_the_culprit(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        self.assertRaisesNaming(self.NOT_FOUND, lambda: self.infer("no_such_model", [("x", "FP32", x)]),
                                "no_such_model")
        self.assertRaisesNaming(self.INVALID, lambda: self.infer("row_mean", [("q", "FP32", x)]), "'q'")
        self.assertRaisesNaming(self.NOT_FOUND, lambda: self.infer("row_mean", [("x", "FP32", x)],
                                                                   model_version="7"), "'7'")
        for name, op in TABLE.ops.items():  # a datatype the op does not take, named with the op
            for datatype in sorted({"FP32", "INT32", "INT64"} - {OIP[d] for d in op.dtypes}):
                inputs = self.op_inputs(name, datatype)
                self.assertRaisesNaming(self.INVALID, lambda: self.infer(name, inputs), name, datatype)
        # Triton's parameters for what opserve's models are not: sequence models (a correlation
        # ID) and classifiers (class_count).
        self.assertRaisesNaming(self.INVALID, lambda: self.infer("row_mean", [("x", "FP32", x)], sequence_id=7,
                                                                 sequence_start=True), "row_mean", "sequence_id")
        classes = self.client_module.InferRequestedOutput("y", class_count=2)
        self.assertRaisesNaming(self.INVALID, lambda: self.infer("row_mean", [("x", "FP32", x)],
                                                                 outputs=[classes]), "'y'", "classification")
        # A shape that does not hold the data sent: set after the client checked the array.
        i = self.client_module.InferInput("x", [2, 3], "FP32")
        i.set_data_from_numpy(x)
        i.set_shape([2, 4])
        self.assertRaisesNaming(self.INVALID, lambda: self.c.infer("row_mean", [i]), "x")
        self.assertTrue(self.c.is_server_live())

    @unittest.skipIf(SHM_MISSING, SHM_MISSING)
    def test_system_shared_memory(self):
        rows, cols = 4, 6
        x = random_tensor(self.rng, "FP32", (rows, cols))
        key, size = f"/opserve_tritonclient_{os.getpid()}_{self.PROTOCOL}", x.nbytes + rows * 4
        handle = shm.create_shared_memory_region("io", key, size)
        self.addCleanup(shm.destroy_shared_memory_region, handle)
        shm.set_shared_memory_region(handle, [x])
        self.c.register_system_shared_memory("io", key, size)
        self.assertEqual(self.shm_status(), [{"name": "io", "key": key, "offset": 0, "byte_size": size}])
        m = self.client_module
        i = m.InferInput("x", [rows, cols], "FP32")
        i.set_shared_memory("io", x.nbytes)
        y = m.InferRequestedOutput("y")
        y.set_shared_memory("io", rows * 4, offset=x.nbytes)
        result = self.c.infer("row_mean", [i], outputs=[y])
        got = shm.get_contents_as_numpy(handle, np.float32, [rows], offset=x.nbytes)
        ok, why = TABLE.check("row_mean", self.algorithm(result), [("FLOAT32", x.shape, x.tobytes())],
                              ("FLOAT32", got.shape, got.tobytes()))
        self.assertTrue(ok, why)
        self.assertRaisesNaming(self.NOT_FOUND, lambda: self.c.register_system_shared_memory(
            "r2", "/no_such_object", 4), "/no_such_object")
        self.c.unregister_system_shared_memory("io")
        self.assertEqual(self.shm_status(), [])

    def test_what_opserve_does_not_serve_is_unimplemented_naming_it(self):
        for rpc, call in (("RepositoryModelLoad", lambda: self.c.load_model("row_mean")),
                          ("RepositoryModelUnload", lambda: self.c.unload_model("row_mean")),
                          ("TraceSetting", lambda: self.c.get_trace_settings()),
                          ("TraceSetting", lambda: self.c.update_trace_settings("row_mean", {"trace_level": ["OFF"]})),
                          ("LogSettings", lambda: self.c.get_log_settings()),
                          ("LogSettings", lambda: self.c.update_log_settings({"log_info": True}))):
            with self.subTest(rpc=rpc):
                self.assertRaisesNaming(self.UNIMPLEMENTED, call, rpc)

    def test_statistics_count_the_requests_sent(self):
        def counts():
            stats = self.statistics("row_max")["model_stats"]
            self.assertEqual(len(stats), 1)
            # Every duration is there, as Triton gives them; JSON from protobuf (tritonclient.grpc's
            # as_json) leaves out zero counts.
            s = stats[0]["inference_stats"]
            self.assertEqual(set(s), {"success", "fail", "queue", "compute_input", "compute_infer",
                                      "compute_output"})
            return {**{k: int(s.get(k, {}).get("count", 0)) for k in ("success", "fail")},
                    **{k: int(stats[0].get(k, 0)) for k in ("inference_count", "execution_count")}}
        before = counts()
        x = random_tensor(self.rng, "FP32", (2, 5))
        for _ in range(3):
            self.infer("row_max", [("x", "FP32", x)])
        with self.assertRaises(InferenceServerException):
            self.infer("row_max", [("x", "FP32", x)], parameters={"algorithm": "no_such_algorithm"})
        after = counts()
        self.assertEqual({k: after[k] - before[k] for k in after},
                         {"success": 3, "fail": 1, "inference_count": 3, "execution_count": 3})
        self.assertEqual({s["name"] for s in self.statistics("")["model_stats"]}, TABLE.names("cpu"))


@unittest.skipIf(HTTP_MISSING, HTTP_MISSING)
class TritonclientHttp(Cases, unittest.TestCase):
    PROTOCOL = "http"
    NOT_FOUND, INVALID, UNIMPLEMENTED = "404", "400", "501"
    client_module = httpclient

    @staticmethod
    def encodings(datatype):
        """JSON, then binary tensor data; BF16 once, its inputs binary and its output JSON."""
        return (False,) if datatype == "BF16" else (False, True)

    def connect(self):
        return httpclient.InferenceServerClient(f"127.0.0.1:{self.server.port}", network_timeout=30.0)

    def outputs(self, datatype, binary):
        # InferResult.as_numpy reads binary data as the datatype's numpy type, float32 for BF16:
        # a BF16 output is asked for as JSON (its inputs go binary: see infer).
        return [httpclient.InferRequestedOutput("y", binary_data=binary and datatype != "BF16")]

    def test_compressed_request_bodies(self):
        # Binary tensor data only: this client compresses a JSON-only body, a str, with
        # gzip.compress, which takes bytes.
        for algorithm in ("gzip", "deflate"):
            with self.subTest(algorithm=algorithm):
                inputs = self.op_inputs("matmul", "FP32")
                result = self.infer("matmul", inputs, True, self.outputs("FP32", True),
                                    request_compression_algorithm=algorithm,
                                    response_compression_algorithm=algorithm)
                self.check_result("matmul", inputs, result)

    def server_metadata(self):
        return self.c.get_server_metadata()

    def metadata(self, name):
        return self.c.get_model_metadata(name)

    def config(self, name):
        return self.c.get_model_config(name)

    def repository_index(self):
        return self.c.get_model_repository_index()

    def statistics(self, name):
        return self.c.get_inference_statistics(name)

    def shm_status(self):
        return self.c.get_system_shared_memory_status()

    def response(self, result):
        return result.get_response()

    def algorithm(self, result):
        return result.get_response()["parameters"]["algorithm"]

    def output_datatype(self, result, name):
        return result.get_output(name)["datatype"]


@unittest.skipIf(GRPC_MISSING, GRPC_MISSING)
class TritonclientGrpc(Cases, unittest.TestCase):
    """The same cases through tritonclient.grpc, its answers read as JSON (as_json=True: int64
    values as strings) where it offers that."""

    PROTOCOL = "grpc"
    NOT_FOUND, INVALID = "StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT"
    UNIMPLEMENTED = "StatusCode.UNIMPLEMENTED"
    client_module = grpcclient

    def connect(self):
        return grpcclient.InferenceServerClient(f"127.0.0.1:{self.server.grpc_port}")

    @staticmethod
    def encodings(datatype):
        return (None,)  # the tensor bytes always travel raw (raw_input_contents)

    def outputs(self, datatype, binary):
        return [grpcclient.InferRequestedOutput("y")]

    def server_metadata(self):
        return self.c.get_server_metadata(as_json=True)

    def metadata(self, name):
        return self.c.get_model_metadata(name, as_json=True)

    def config(self, name):
        return self.c.get_model_config(name, as_json=True)["config"]

    def repository_index(self):
        return self.c.get_model_repository_index(as_json=True)["models"]

    def statistics(self, name):
        return self.c.get_inference_statistics(name, as_json=True)

    def shm_status(self):
        regions = self.c.get_system_shared_memory_status(as_json=True).get("regions", {})
        return [{"name": r["name"], "key": r["key"], "offset": int(r.get("offset", 0)),
                 "byte_size": int(r["byte_size"])} for r in regions.values()]

    def response(self, result):
        return result.get_response(as_json=True)

    def algorithm(self, result):
        return result.get_response().parameters["algorithm"].string_param

    def output_datatype(self, result, name):
        return result.get_output(name).datatype


def main():
    global ARGS, TABLE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opserve", required=True, help="the server binary")
    parser.add_argument("--work-dir", required=True, help="for server logs")
    parser.add_argument("--op-table", help="opserve-op-table of the server's build")
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.work_dir, exist_ok=True)
    TABLE = op_table.OpTable(ARGS.op_table or op_table.find_tool(ARGS.opserve))
    program = unittest.main(argv=[sys.argv[0], *rest], verbosity=2, exit=False)
    result = program.result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun and len(result.skipped) == result.testsRun:
        sys.exit(SKIPPED)


if __name__ == "__main__":
    main()
