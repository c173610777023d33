"""What http_test.py needs that is not a test: a server with its HTTP port, a keep-alive HTTP
client that sends requests as tritonclient.http does (http_test.py's docstring), and datatype
conversions, with the standard library alone. Not a test itself.
"""

import http.client
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
from e2e_script import start_opserve  # noqa: E402

STARTUP_SECONDS = 60
TIMEOUT = 30
OIP = {"FLOAT32": "FP32", "INT32": "INT32", "INT64": "INT64", "BFLOAT16": "BF16"}
API = {v: k for k, v in OIP.items()}
FORMAT = {"FP32": "f", "INT32": "i", "INT64": "q", "BF16": "H"}


def bf16_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def values(rng, datatype, count):
    """Fresh random elements: JSON values and the same elements as bytes."""
    if datatype == "BF16":
        bits = [struct.unpack("<H", struct.pack("<f", rng.uniform(-4, 4))[2:])[0] for _ in range(count)]
        return [bf16_to_float(b) for b in bits], struct.pack(f"<{count}H", *bits)
    if datatype == "FP32":
        floats = list(struct.unpack(f"<{count}f", struct.pack(f"<{count}f", *(rng.uniform(-4, 4) for _ in range(count)))))
        return floats, struct.pack(f"<{count}f", *floats)
    ints = [rng.randint(-100, 100) for _ in range(count)]
    return ints, struct.pack(f"<{count}{FORMAT[datatype]}", *ints)


def to_bytes(datatype, data):
    if datatype == "BF16":
        return b"".join(struct.pack("<f", v)[2:] for v in data)
    return struct.pack(f"<{len(data)}{FORMAT[datatype]}", *data)


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Server:
    """opserve --http_port=0 on loopback, its log in directory/opserve.log; `port` is its HTTP
    port."""

    def __init__(self, binary, directory, *extra):
        os.makedirs(directory, exist_ok=True)
        self.log_path = os.path.join(directory, "opserve.log")
        self.process, self.grpc_port = start_opserve(binary, "cpu", self.log_path, ("--http_port=0", *extra))
        deadline = time.monotonic() + STARTUP_SECONDS
        self.port = None
        while time.monotonic() < deadline and self.process.poll() is None:
            log = self.log()
            if "listening on" in log:
                self.https = "HTTPS on 127.0.0.1:" in log
                self.port = int(log.split("HTTPS on " if self.https else "HTTP on ")[1]
                                .split(":")[1].split()[0])
                return
            time.sleep(0.05)
        raise RuntimeError(f"opserve did not listen:\n{self.log()}")

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        self.process.terminate()
        return self.process.wait(timeout=STARTUP_SECONDS)


class Client:
    """One keep-alive connection, as tritonclient.http's connection pool keeps."""

    def __init__(self, port, token=None, tls=None):
        """tls: an ssl.SSLContext for HTTPS."""
        if tls is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        else:
            self.conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT, context=tls)
        self.token = token

    def request(self, method, path, body=None, headers=None):
        """(status, headers, body bytes)."""
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        self.conn.request(method, path, body=body, headers=h)
        r = self.conn.getresponse()
        data = r.read()
        if r.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return r.status, r, data

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body=b""):
        return self.request("POST", path, body)

    def json(self, method, path, body=None):
        status, _, data = self.request(method, path, body)
        return status, json.loads(data) if data else None

    def infer(self, model, inputs, outputs=None, binary=False, binary_output=False, version="", **params):
        """inputs: [(name, datatype, shape, json values or bytes)]. Returns (status, header, [output bytes or None])."""
        request = {"id": "r1", "inputs": []}
        tail = b""
        for name, datatype, shape, data in inputs:
            t = {"name": name, "shape": list(shape), "datatype": datatype}
            if binary:
                raw = data if isinstance(data, bytes) else to_bytes(datatype, data)
                t["parameters"] = {"binary_data_size": len(raw)}
                tail += raw
            else:
                t["data"] = data
            request["inputs"].append(t)
        if outputs is not None:
            request["outputs"] = outputs
        elif binary_output:
            params["binary_data_output"] = True
        if params:
            request["parameters"] = params
        body = json.dumps(request).encode()
        headers = {"Inference-Header-Content-Length": str(len(body))} if binary else {}
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        status, r, data = self.request("POST", path, body + tail, headers)
        header_length = r.getheader("Inference-Header-Content-Length")
        if header_length is None:
            return status, json.loads(data), []
        n = int(header_length)
        header = json.loads(data[:n])
        at, blobs = n, []
        for o in header["outputs"]:
            size = o.get("parameters", {}).get("binary_data_size")
            blobs.append(None if size is None else data[at:at + size])
            at += size or 0
        return status, header, blobs
