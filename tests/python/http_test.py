"""The Open Inference Protocol's HTTP/REST binding (--http_port) against real servers, with the
Python standard library only (http.client, json, struct, mmap).

The requests are those tritonclient.http (triton-inference-server/client,
src/python/library/tritonclient/http/_client.py, _infer_input.py, _requested_output.py,
_utils.py) sends, byte for byte in what matters:
  * infer: POST /v2/models/{model}[/versions/{v}]/infer, the body json.dumps() of
    {"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "parameters"?, "data"?}],
    "outputs"?: [{"name", "parameters": {"binary_data": bool}}]}; with binary inputs
    (InferInput.set_data_from_numpy(binary_data=True)) each input's parameters carry
    "binary_data_size", its bytes follow the JSON in the order of inputs, and the header
    Inference-Header-Content-Length gives the JSON's length; no outputs requested with
    binary_data_output=True puts {"binary_data_output": true} in the request's parameters;
  * the answer is read as InferResult does: JSON, or with Inference-Header-Content-Length the
    JSON then each output's binary_data_size bytes in order;
  * health (GET /v2/health/live|ready), server and model metadata (GET /v2,
    /v2/models/{m}[/versions/{v}]), readiness (.../ready), config (.../config), statistics
    (.../stats, /v2/models/stats), repository index (POST /v2/repository/index, body "" or
    {"ready": true}), system shared memory (POST /v2/systemsharedmemory/region/{r}/register with
    {"key", "offset", "byte_size"}, GET .../status, POST .../unregister) and the CUDA one;
  * the Authorization header as tritonclient's `headers=` passes it.
The ops, their test shapes and their CPU reference come from the op table (op_table.py).
"""

import argparse
import gzip
import http.client
import json
import mmap
import os
import random
import ssl
import subprocess
import sys
import time
import unittest
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
import op_table  # noqa: E402
from e2e_script import start_opserve  # noqa: E402
from http_support import (API, OIP, STARTUP_SECONDS, TIMEOUT, Client, Server, count, to_bytes,  # noqa: E402
                          values)


ARGS = None
TABLE = None


class HttpTestCase(unittest.TestCase):
    server_args = ()

    @classmethod
    def setUpClass(cls):
        cls.server = Server(ARGS.opserve, os.path.join(ARGS.work_dir, cls.__name__), *cls.server_args)

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        if status != 0:
            raise AssertionError(f"opserve exited {status}:\n{cls.server.log()}")

    def setUp(self):
        self.c = Client(self.server.port)
        self.rng = random.Random(7)

    def tearDown(self):
        self.c.conn.close()

    def assertError(self, status, got, *culprits):
        """got: (status, json body): the protocol's {"error": ...} naming each culprit."""
        self.assertEqual(got[0], status, got[1])
        self.assertIsInstance(got[1], dict)
        for c in culprits:
            self.assertIn(c, got[1]["error"])

    def op_case(self, op, datatype, case=None):
        """[(name, datatype, shape, json values, bytes)] for the op's first small case."""
        shapes = case or TABLE.op(op).small_shapes[-1]
        names = ["x"] if len(shapes) == 1 else ["a", "b"]
        out = []
        for name, shape in zip(names, shapes):
            data, raw = values(self.rng, datatype, count(shape))
            out.append((name, datatype, shape, data, raw))
        return out

    def check_op(self, op, algorithm, inputs, output):
        """output: (datatype, shape, bytes) against the CPU reference of `algorithm`."""
        ok, why = TABLE.check(op, algorithm, [(API[d], s, raw) for _, d, s, _, raw in inputs],
                              (API[output[0]], output[1], output[2]))
        self.assertTrue(ok, f"{op}/{algorithm}: {why}")


class Endpoints(HttpTestCase):
    server_args = ("--max_message_bytes=4194304",)

    def test_health_and_server_metadata(self):
        self.assertEqual(self.c.get("/v2/health/live")[0], 200)
        self.assertEqual(self.c.get("/v2/health/ready")[0], 200)
        status, meta = self.c.json("GET", "/v2")
        self.assertEqual(status, 200)
        self.assertEqual(meta["name"], "opserve")
        for ext in ("binary_tensor_data", "system_shared_memory"):
            self.assertIn(ext, meta["extensions"])

    def test_model_metadata_config_readiness_of_every_op(self):
        for name, op in TABLE.ops.items():
            with self.subTest(op=name):
                inputs = ["x"] if op.arity == 1 else ["a", "b"]
                for path in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
                    status, meta = self.c.json("GET", path)
                    self.assertEqual(status, 200, meta)
                    self.assertEqual(meta["versions"], ["1"])
                    self.assertEqual([i["name"] for i in meta["inputs"]], inputs)
                    self.assertEqual([o["name"] for o in meta["outputs"]], ["y"])
                    self.assertTrue(all(isinstance(d, int) for i in meta["inputs"] for d in i["shape"]))
                status, config = self.c.json("GET", f"/v2/models/{name}/config")
                self.assertEqual(status, 200)
                self.assertEqual(config["name"], name)
                self.assertEqual([i["name"] for i in config["input"]], inputs)
                self.assertEqual(self.c.get(f"/v2/models/{name}/ready")[0], 200)
                self.assertEqual(self.c.get(f"/v2/models/{name}/versions/1/ready")[0], 200)
        self.assertError(404, self.c.json("GET", "/v2/models/no_such_model"), "no_such_model")
        # Not ready, as Triton answers a model or version it does not have: 400, not 404.
        for path in ("/v2/models/no_such_model/ready", "/v2/models/row_mean/versions/2/ready"):
            self.assertEqual(self.c.get(path)[0], 400, path)
        self.assertError(404, self.c.json("GET", "/v2/models/row_mean/versions/2/config"), "'2'")

    def test_repository_index(self):
        for body in (b"", b'{"ready": true}'):
            status, index = self.c.json("POST", "/v2/repository/index", body)
            self.assertEqual(status, 200)
            self.assertEqual({m["name"] for m in index}, set(TABLE.names("cpu")))
            self.assertTrue(all(m["state"] == "READY" and m["version"] == "1" for m in index))
        self.assertError(400, self.c.json("POST", "/v2/repository/index", b'{"ready": 3}'), "'ready'")
        self.assertError(400, self.c.json("POST", "/v2/repository/index", b'{"nope": 1}'), "'nope'")

    def test_json_and_binary_infer_of_every_op(self):
        for name, op in TABLE.ops.items():
            for datatype in (OIP[d] for d in op.dtypes):
                for binary in (False, True):
                    with self.subTest(op=name, datatype=datatype, binary=binary):
                        inputs = self.op_case(name, datatype)
                        wire = [(n, d, s, raw if binary else data) for n, d, s, data, raw in inputs]
                        outputs = [{"name": "y", "parameters": {"binary_data": True}}] if binary else None
                        status, resp, blobs = self.c.infer(name, wire, outputs, binary=binary)
                        self.assertEqual(status, 200, resp)
                        self.assertEqual(resp["model_name"], name)
                        self.assertEqual(resp["id"], "r1")
                        (out,) = resp["outputs"]
                        self.assertEqual(out["name"], "y")
                        if binary:
                            raw = blobs[0]
                            self.assertEqual(out["parameters"]["binary_data_size"], len(raw))
                            self.assertNotIn("data", out)
                        else:
                            raw = to_bytes(out["datatype"], out["data"])
                        self.check_op(name, resp["parameters"]["algorithm"], inputs,
                                      (out["datatype"], out["shape"], raw))

    def test_json_data_before_or_after_its_datatype(self):
        # The server reads "data" in one pass where "datatype" came first, and from the parsed
        # document otherwise: both orders give the same bytes, and the same refusals.
        def infer(body):
            status, _, data = self.c.request("POST", "/v2/models/row_mean/infer", body.encode())
            return status, json.loads(data)

        def body(datatype, data, data_first):
            fields = [f'"datatype": "{datatype}"', f'"data": {data}']
            if data_first:
                fields.reverse()
            return '{"inputs": [{"name": "x", "shape": [2, 3], ' + ", ".join(fields) + "}]}"

        for data_first in (False, True):
            with self.subTest(data_first=data_first):
                (x,) = self.op_case("row_mean", "FP32", [(2, 3)])
                nested = json.dumps([x[3][:3], x[3][3:]])
                status, resp = infer(body("FP32", nested, data_first))
                self.assertEqual(status, 200, resp)
                out = resp["outputs"][0]
                self.check_op("row_mean", resp["parameters"]["algorithm"], [x],
                              (out["datatype"], out["shape"], to_bytes(out["datatype"], out["data"])))
                for datatype, data, culprit in (
                        ("FP32", '[[1, 2, 3], [4, "5", 6]]', "element 4 is not a number"),
                        ("FP32", "[1, 2, 3, 4, 5, {}]", "element 5 is not a number"),
                        ("INT32", "[1, 2, 2147483648, 4, 5, 6]", "element 2 is not a 32-bit integer"),
                        ("INT32", "[1, 2, 3, 4, 5, 6.0]", "element 5 is not a 32-bit integer"),
                        ("INT64", "[1, 9223372036854775808, 3, 4, 5, 6]", "element 1 is not a 64-bit integer"),
                        ("FP32", "[" * 65 + "1" + "]" * 65, "more than 64 deep")):
                    self.assertError(400, infer(body(datatype, data, data_first)), "input 'x'", culprit)

    def test_binary_data_output_and_mixed_inputs(self):
        inputs = self.op_case("matmul", "FP32", [(3, 5), (5, 2)])
        # binary_data_output without outputs: every output binary.
        status, resp, blobs = self.c.infer("matmul", [(n, d, s, raw) for n, d, s, _, raw in inputs],
                                           binary=True, binary_output=True)
        self.assertEqual(status, 200, resp)
        self.check_op("matmul", resp["parameters"]["algorithm"], inputs, ("FP32", [3, 2], blobs[0]))
        # One input as JSON data, the other binary, the output as JSON.
        (a, b) = inputs
        request = {"inputs": [{"name": "a", "shape": [3, 5], "datatype": "FP32", "data": a[3]},
                              {"name": "b", "shape": [5, 2], "datatype": "FP32",
                               "parameters": {"binary_data_size": len(b[4])}}],
                   "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}
        body = json.dumps(request).encode()
        status, r, data = self.c.request("POST", "/v2/models/matmul/versions/1/infer", body + b[4],
                                         {"Inference-Header-Content-Length": str(len(body))})
        self.assertEqual(status, 200, data)
        self.assertIsNone(r.getheader("Inference-Header-Content-Length"))
        out = json.loads(data)["outputs"][0]
        self.check_op("matmul", json.loads(data)["parameters"]["algorithm"], inputs,
                      ("FP32", out["shape"], to_bytes("FP32", out["data"])))

    def test_algorithm_parameter(self):
        for name, op in TABLE.ops.items():
            for row in op.rows("cpu"):
                with self.subTest(op=name, algorithm=row["name"]):
                    inputs = self.op_case(name, OIP[row["dtypes"][0]])
                    wire = [(n, d, s, data) for n, d, s, data, _ in inputs]
                    status, resp, _ = self.c.infer(name, wire, algorithm=row["name"])
                    self.assertEqual(status, 200, resp)
                    self.assertEqual(resp["parameters"]["algorithm"], row["name"])
            wire = [(n, d, s, data) for n, d, s, data, _ in self.op_case(name, OIP[op.dtypes[0]])]
            status, resp, _ = self.c.infer(name, wire, algorithm="no_such_algorithm")
            self.assertError(400, (status, resp), "no_such_algorithm")

    def test_bad_requests_name_the_culprit(self):
        x = ("x", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])
        infer = lambda body, headers=None: (lambda s, r, d: (s, json.loads(d)))(
            *self.c.request("POST", "/v2/models/row_mean/infer", body, headers))
        self.assertError(400, infer(b"{not json"), "not JSON")
        self.assertError(400, infer(b"[1, 2]"), "JSON object")
        self.assertError(400, infer(b'{"inputs": 3}'), "'inputs'")
        self.assertError(400, infer(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, "a"]}]}'),
                         "input 'x'", "element 1")
        self.assertError(400, infer(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2]}]}'),
                         "input 'x'", "no bytes")
        self.assertError(400, infer(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": "2", "data": [1]}]}'),
                         "'shape'")
        self.assertError(400, self.c.infer("row_mean", [("x", "FP33", [2, 3], [1] * 6)])[:2], "FP33")
        # A datatype an op does not take (from the table: matmul's are floating point today).
        for name, op in TABLE.ops.items():
            for datatype in sorted(set(OIP.values()) - {OIP[d] for d in op.dtypes} - {"BF16"}):
                inputs = [(n, datatype, s, data) for n, _, s, data, _ in self.op_case(name, "INT32")]
                self.assertError(400, self.c.infer(name, inputs)[:2], name, datatype)
        self.assertError(400, self.c.infer("row_mean", [("x", "FP32", [2, 4], [1] * 6)])[:2], "x")
        self.assertError(400, self.c.infer("row_mean", [("q", "FP32", [2, 3], [1] * 6)])[:2], "'q'")
        self.assertError(404, self.c.infer("no_such_model", [x])[:2], "no_such_model")
        self.assertError(404, self.c.infer("row_mean", [x], version="7")[:2], "'7'")
        header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                                         "parameters": {"binary_data_size": 8}}]}).encode()
        self.assertError(400, infer(header + b"\0" * 4, {"Inference-Header-Content-Length": str(len(header))}),
                         "binary_data_size is 8")
        self.assertError(400, infer(header + b"\0" * 12, {"Inference-Header-Content-Length": str(len(header))}),
                         "4 bytes")
        self.assertError(400, infer(header, {"Inference-Header-Content-Length": "99999"}),
                         "Inference-Header-Content-Length")
        self.assertError(400, infer(header, {"Inference-Header-Content-Length": "-1"}),
                         "Inference-Header-Content-Length")
        # A body past --max_message_bytes: 413, refused before it is read.
        self.assertError(413, infer(b" " * (5 << 20)), "larger than the server's limit")
        self.c.conn.close()  # the refused body was never read: a fresh connection
        # A chunked body (no Content-Length) is read up to the limit, and refused past it.
        chunked = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=TIMEOUT)
        self.addCleanup(chunked.close)
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 6]}]}).encode()
        chunked.request("POST", "/v2/models/row_mean/infer", body=iter([body[:7], body[7:]]), encode_chunked=True)
        r = chunked.getresponse()
        self.assertEqual((r.status, json.loads(r.read())["outputs"][0]["data"]), (200, [3.0]))
        chunked.request("POST", "/v2/models/row_mean/infer", body=iter([b" " * (1 << 20)] * 5), encode_chunked=True)
        r = chunked.getresponse()
        self.assertError(413, (r.status, json.loads(r.read())), "chunked request body", "4194304")
        self.c = Client(self.server.port)
        self.assertError(405, self.c.json("DELETE", "/v2/health/live"), "GET", "DELETE")
        self.assertError(404, self.c.json("GET", "/v1/models"), "/v1/models")
        # Garbage of every kind, and the server still answers.
        deep = b"[" * 100000 + b"]" * 100000
        for body in (b"\xff\xfe" * 100, b"{" * 100000, b'{"inputs": ' + deep + b"}", b"\0" * 1000,
                     b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ' + deep + b"}]}",
                     b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "parameters": '
                     + deep + b"}]}"):
            status, _, _ = self.c.request("POST", "/v2/models/row_mean/infer", body)
            self.assertEqual(status, 400)
        self.assertEqual(self.c.get("/v2/health/live")[0], 200)

    def test_compressed_bodies(self):
        """Content-Encoding gzip or deflate (tritonclient's request_compression_algorithm): the
        body decoded first, Inference-Header-Content-Length counting decoded bytes, the limit
        applying to the decoded body; anything else refused naming the encoding."""
        inputs = self.op_case("matmul", "FP32", [(3, 5), (5, 2)])
        (a, b) = inputs
        request = json.dumps({"inputs": [{"name": "a", "shape": [3, 5], "datatype": "FP32", "data": a[3]},
                                         {"name": "b", "shape": [5, 2], "datatype": "FP32",
                                          "parameters": {"binary_data_size": len(b[4])}}]}).encode()
        plain = request + b[4]
        header = {"Inference-Header-Content-Length": str(len(request))}
        for encoding, body in (("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain)),
                               ("GZIP", gzip.compress(plain))):
            with self.subTest(encoding=encoding):
                status, _, data = self.c.request("POST", "/v2/models/matmul/infer", body,
                                                 {**header, "Content-Encoding": encoding})
                self.assertEqual(status, 200, data)
                out = json.loads(data)["outputs"][0]
                self.check_op("matmul", json.loads(data)["parameters"]["algorithm"], inputs,
                              ("FP32", out["shape"], to_bytes("FP32", out["data"])))
        # Bodies read whole (the repository index's, the register requests') are decoded too.
        status, _, data = self.c.request("POST", "/v2/repository/index", gzip.compress(b'{"ready": true}'),
                                         {"Content-Encoding": "gzip"})
        self.assertEqual(status, 200, data)
        infer = lambda body, encoding: (lambda s, r, d: (s, json.loads(d)))(*self.c.request(
            "POST", "/v2/models/matmul/infer", body, {**header, "Content-Encoding": encoding}))
        self.assertError(400, infer(gzip.compress(plain), "br"), "Content-Encoding 'br'")
        self.assertError(400, infer(b"not gzip at all", "gzip"), "not gzip data")
        self.assertError(400, infer(gzip.compress(plain)[:-9], "gzip"), "ends early")
        self.assertError(400, infer(zlib.compress(plain) + b"junk", "deflate"), "follow the end")
        # Past --max_message_bytes once decoded: 413, though the compressed body is small.
        self.assertError(413, infer(gzip.compress(b" " * (5 << 20)), "gzip"), "decoded", "4194304")
        self.assertEqual(self.c.get("/v2/health/live")[0], 200)

    def test_system_shared_memory(self):
        key = f"/opserve_http_test_{os.getpid()}"
        rows, cols = 4, 6
        size = rows * cols * 4 + 64
        fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            region = mmap.mmap(fd, size)
            data, raw = values(self.rng, "FP32", rows * cols)
            region[:len(raw)] = raw
            status, _, body = self.c.post("/v2/systemsharedmemory/region/io/register",
                                          json.dumps({"key": key, "offset": 0, "byte_size": size}).encode())
            self.assertEqual(status, 200, body)
            status, regions = self.c.json("GET", "/v2/systemsharedmemory/status")
            self.assertEqual(regions, [{"name": "io", "key": key, "offset": 0, "byte_size": size}])
            self.assertEqual(self.c.json("GET", "/v2/systemsharedmemory/region/io/status")[1], regions)
            request = {"inputs": [{"name": "x", "shape": [rows, cols], "datatype": "FP32",
                                   "parameters": {"shared_memory_region": "io", "shared_memory_byte_size": len(raw)}}],
                       "outputs": [{"name": "y", "parameters": {"shared_memory_region": "io",
                                                                "shared_memory_offset": len(raw),
                                                                "shared_memory_byte_size": rows * 4}}]}
            status, resp = self.c.json("POST", "/v2/models/row_mean/infer", json.dumps(request).encode())
            self.assertEqual(status, 200, resp)
            out = resp["outputs"][0]
            self.assertEqual(out["parameters"]["shared_memory_region"], "io")
            self.assertNotIn("data", out)
            self.check_op("row_mean", resp["parameters"]["algorithm"], [("x", "FP32", (rows, cols), data, raw)],
                          ("FP32", out["shape"], bytes(region[len(raw):len(raw) + rows * 4])))
            self.assertError(404, self.c.json("POST", "/v2/systemsharedmemory/region/r2/register",
                                              json.dumps({"key": "/no_such_object", "byte_size": 4}).encode()),
                             "/no_such_object")
            self.assertError(400, self.c.json("POST", "/v2/systemsharedmemory/region/r2/register",
                                              b'{"key": 7}'), "'key'")
            self.assertEqual(self.c.post("/v2/systemsharedmemory/region/io/unregister")[0], 200)
            self.assertEqual(self.c.json("GET", "/v2/systemsharedmemory/status")[1], [])
            region.close()
        finally:
            os.close(fd)
            os.unlink(f"/dev/shm{key}")
        # The CPU backend has no CUDA shared memory: the service's UNIMPLEMENTED, 501.
        self.assertError(501, self.c.json("POST", "/v2/cudasharedmemory/region/g/register",
                                          b'{"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 4}'),
                         "CUDA")

    def test_triton_parameters_opserve_does_not_serve_are_refused(self):
        x = [("x", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])]
        for params in ({"sequence_id": 7}, {"sequence_id": "session-7"}, {"sequence_start": True},
                       {"sequence_end": True}):
            with self.subTest(params=params):
                self.assertError(400, self.c.infer("row_mean", x, **params)[:2],
                                 "'row_mean'", f"'{next(iter(params))}'", "sequence model")
        status, resp, _ = self.c.infer("row_mean", x, [{"name": "y", "parameters": {"classification": 2}}])
        self.assertError(400, (status, resp), "'y'", "'classification'")
        # Values that ask for nothing are accepted, as Triton accepts them.
        status, resp, _ = self.c.infer("row_mean", x, [{"name": "y", "parameters": {"classification": 0}}],
                                       sequence_id=0, sequence_start=False, sequence_end=False)
        self.assertEqual((status, resp["outputs"][0]["data"]), (200, [2.0, 5.0]), resp)

    def test_statistics(self):
        def success(model):
            status, stats = self.c.json("GET", f"/v2/models/{model}/stats")
            self.assertEqual(status, 200)
            return stats["model_stats"][0]["inference_stats"]["success"]["count"]
        before = success("row_max")
        self.c.infer("row_max", [("x", "FP32", [2, 2], [1, 2, 3, 4])])
        self.assertEqual(success("row_max"), before + 1)
        status, stats = self.c.json("GET", "/v2/models/stats")
        self.assertEqual({s["name"] for s in stats["model_stats"]}, set(TABLE.names("cpu")))
        self.assertError(404, self.c.json("GET", "/v2/models/no_such_model/stats"), "no_such_model")


class NeverCalled(HttpTestCase):
    """A server no request has reached."""

    def test_statistics_of_models_never_called_are_zeros(self):
        # Triton's binding gives every duration of inference_stats, zeros included.
        zeros = {part: {"count": 0, "ns": 0} for part in
                 ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")}
        status, one = self.c.json("GET", "/v2/models/row_max/stats")
        status_all, every = self.c.json("GET", "/v2/models/stats")
        self.assertEqual((status, status_all), (200, 200))
        for stats in one["model_stats"] + every["model_stats"]:
            with self.subTest(model=stats["name"]):
                self.assertEqual(stats.get("inference_stats"), zeros)
                self.assertEqual((stats["inference_count"], stats["execution_count"]), (0, 0))


class Tokens(HttpTestCase):
    @classmethod
    def setUpClass(cls):
        path = os.path.join(ARGS.work_dir, "tokens.txt")
        with open(path, "w") as f:
            f.write("alice:token-a\nbob:token-b\n")
        cls.server_args = (f"--auth_tokens_file={path}",)
        super().setUpClass()

    def test_tokens_and_tenants(self):
        # Probes carry no token.
        self.assertEqual(self.c.get("/v2/health/ready")[0], 200)
        status, r, data = self.c.request("GET", "/v2/models/row_mean")
        self.assertEqual(status, 401, data)
        self.assertEqual(r.getheader("WWW-Authenticate"), "Bearer")
        self.assertIn("authorization", json.loads(data)["error"])
        wrong = Client(self.server.port, "wrong")
        self.assertError(401, wrong.json("GET", "/v2"), "unknown bearer token")
        wrong.conn.close()
        alice, bob = Client(self.server.port, "token-a"), Client(self.server.port, "token-b")
        self.addCleanup(alice.conn.close)
        self.addCleanup(bob.conn.close)
        self.assertEqual(alice.get("/v2/models/row_mean")[0], 200)
        status, resp, _ = alice.infer("row_mean", [("x", "FP32", [1, 2], [1, 3])])
        self.assertEqual((status, resp["outputs"][0]["data"]), (200, [2.0]))
        key = f"/opserve_http_tokens_{os.getpid()}"
        fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, 64)
            body = json.dumps({"key": key, "byte_size": 64}).encode()
            self.assertEqual(alice.post("/v2/systemsharedmemory/region/mine/register", body)[0], 200)
            self.assertEqual(len(alice.json("GET", "/v2/systemsharedmemory/status")[1]), 1)
            self.assertEqual(bob.json("GET", "/v2/systemsharedmemory/status")[1], [])
            self.assertEqual(alice.post("/v2/systemsharedmemory/unregister")[0], 200)
        finally:
            os.close(fd)
            os.unlink(f"/dev/shm{key}")


class PortInUse(unittest.TestCase):
    def test_a_port_in_use_is_refused_naming_it(self):
        holder = Server(ARGS.opserve, os.path.join(ARGS.work_dir, "PortHolder"))
        try:
            log = os.path.join(ARGS.work_dir, "second.log")
            process, _ = start_opserve(ARGS.opserve, "cpu", log, (f"--http_port={holder.port}",))
            self.assertEqual(process.wait(timeout=STARTUP_SECONDS), 2)
            with open(log) as f:
                self.assertIn(f"127.0.0.1:{holder.port} (--http_port)", f.read())
        finally:
            holder.stop()


def make_pki(directory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA
    (openssl, a CI dependency): {name: path}."""
    os.makedirs(directory, exist_ok=True)
    p = {n: os.path.join(directory, f"{n}.pem") for n in
         ("ca", "ca_key", "server", "server_key", "client", "client_key", "csr")}

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", p["ca_key"], "-out", p["ca"],
        "-days", "1", "-subj", "/CN=opserve test CA")
    for who, subject, ext in (("server", "/CN=localhost", "subjectAltName=IP:127.0.0.1"),
                              ("client", "/CN=test client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", p[f"{who}_key"], "-out", p["csr"],
            "-subj", subject)
        ext_file = os.path.join(directory, f"{who}.ext")
        with open(ext_file, "w") as f:
            f.write(ext + "\n")
        run("x509", "-req", "-in", p["csr"], "-CA", p["ca"], "-CAkey", p["ca_key"],
            "-CAcreateserial", "-out", p[who], "-days", "1", "-extfile", ext_file)
    return p


class Tls(unittest.TestCase):
    """The TLS flags make the HTTP port HTTPS, with the gRPC port's certificate, key and client
    CA: never plaintext HTTP beside a TLS gRPC port."""

    @classmethod
    def setUpClass(cls):
        cls.pki = make_pki(os.path.join(ARGS.work_dir, "Tls"))

    def start(self, name, *extra):
        server = Server(ARGS.opserve, os.path.join(ARGS.work_dir, "Tls", name),
                        f"--tls_cert={self.pki['server']}", f"--tls_key={self.pki['server_key']}",
                        *extra)
        self.addCleanup(server.stop)
        self.assertTrue(server.https, server.log())
        return server

    def context(self, client_certificate=False):
        tls = ssl.create_default_context(cafile=self.pki["ca"])
        if client_certificate:
            tls.load_cert_chain(self.pki["client"], self.pki["client_key"])
        return tls

    def test_https_serves_the_protocol(self):
        server = self.start("https")
        c = Client(server.port, tls=self.context())
        self.addCleanup(c.conn.close)
        self.assertEqual(c.get("/v2/health/ready")[0], 200)
        self.assertEqual(c.json("GET", "/v2")[1]["name"], "opserve")
        status, resp, _ = c.infer("row_mean", [("x", "FP32", [2, 2], [1, 3, 5, 9])])
        self.assertEqual((status, resp["outputs"][0]["data"]), (200, [2.0, 7.0]), resp)
        status, resp, outs = c.infer("row_sum", [("x", "FP32", [1, 3], [1, 2, 3])], binary=True,
                                     binary_output=True)
        self.assertEqual((status, outs[0]), (200, to_bytes("FP32", [6.0])), resp)
        # A client that does not trust the server's CA is refused in the handshake.
        untrusting = Client(server.port, tls=ssl.create_default_context())
        self.addCleanup(untrusting.conn.close)
        with self.assertRaises(ssl.SSLCertVerificationError):
            untrusting.get("/v2/health/ready")
        # Plaintext HTTP to the HTTPS port gets no HTTP answer.
        plain = Client(server.port)
        self.addCleanup(plain.conn.close)
        try:
            status = plain.get("/v2/health/ready")[0]
        except (http.client.HTTPException, OSError):
            status = None
        self.assertNotEqual(status, 200)

    def test_client_ca_requires_client_certificates(self):
        server = self.start("mutual", f"--tls_client_ca={self.pki['ca']}")
        anonymous = Client(server.port, tls=self.context())
        self.addCleanup(anonymous.conn.close)
        with self.assertRaises((ssl.SSLError, OSError, http.client.HTTPException)):
            anonymous.get("/v2/health/ready")
        c = Client(server.port, tls=self.context(client_certificate=True))
        self.addCleanup(c.conn.close)
        self.assertEqual(c.get("/v2/health/ready")[0], 200)
        status, resp, _ = c.infer("row_max", [("x", "FP32", [1, 3], [4, -1, 2])])
        self.assertEqual((status, resp["outputs"][0]["data"]), (200, [4.0]), resp)


def main():
    global ARGS, TABLE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opserve", required=True, help="the server binary")
    parser.add_argument("--work-dir", required=True, help="for server logs")
    parser.add_argument("--op-table", help="opserve-op-table of the server's build")
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.work_dir, exist_ok=True)
    TABLE = op_table.OpTable(ARGS.op_table or op_table.find_tool(ARGS.opserve))
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
