"""opserve's Python client: tensors resident on a GPU server, graphs of ops run on them.

    import numpy as np, opserve
    a = np.random.rand(64, 48).astype(np.float32)
    b = np.random.rand(48, 32)                  # float64: cast=True sends it as float32
    with opserve.Client("127.0.0.1:50051") as client:
        client.put("quickstart_A", a, overwrite=True)
        g = opserve.Graph()
        ab = g.matmul(g.stored("quickstart_A"), g.input("B", b, cast=True))
        g.output(g.row_mean(g.transpose(ab)), name="mean")
        result = client.run(g)
        result["mean"]          # a numpy array
        result.print_table()    # per node: algorithm, kernel_us, bytes, GB/s, fused into
        client.delete("quickstart_A")

Every op the server lists (client.ops()) is a Graph method, g.<op>(...), or g.op(name, ...).
A server of several devices: client.devices() lists them; put(..., device="cuda:1") places a
tensor, put(..., shard=True) splits a matrix by rows over all of them, move(name, device) moves
one, g.output(..., store_as=, device=) keeps a result on one; a RunResult says where it ran
(device) and what it copied between devices (peer_copy_bytes, peer_copy_us).
Many requests in flight on one call: client.stream(graphs) and stream_saved(requests) yield
each one's StreamResult (id, result or error) as it completes.
Also: saved graphs (save_graph, graphs, run_saved, delete_graph), shm=True on put, get and run
for a server on this host, session=, a 30 s deadline on calls that neither run a graph nor
stream a tensor (unary_timeout=), and retries on RESOURCE_EXHAUSTED / UNAVAILABLE (retry=).
opserve.aio.Client is the same client for asyncio. Every failed call raises OpserveError with
the gRPC code and the server's message. BFLOAT16 tensors come back as float32 unless
raw_bfloat16=True asks for their uint16 bits.
"""

from opserve import aio  # opserve.aio.Client after a plain `import opserve`
from opserve._channel import DEFAULT_CHUNK_BYTES, TLS
from opserve._retry import Retry
from opserve._stream import StreamResult
from opserve.client import Client
from opserve.dtypes import DType, bfloat16_bits_to_float32, float32_to_bfloat16_bits
from opserve.errors import OpserveError
from opserve.graph import Graph, Node, Ref
from opserve.types import (AlgorithmInfo, DeviceInfo, GraphInfo, GraphTensor, MoveResult,
                           NodeResult, OpInfo, OpsInfo, RunResult, SavedRunResult, TensorInfo,
                           TensorShard, Timing, format_table)

__version__ = "0.1.0"

__all__ = [
    "AlgorithmInfo", "Client", "aio", "DEFAULT_CHUNK_BYTES", "DType", "DeviceInfo", "Graph",
    "GraphInfo", "GraphTensor", "MoveResult", "Node", "NodeResult", "OpInfo", "OpsInfo",
    "OpserveError", "Ref", "Retry", "RunResult", "SavedRunResult", "StreamResult", "TLS",
    "TensorInfo", "TensorShard", "Timing", "bfloat16_bits_to_float32", "float32_to_bfloat16_bits",
    "format_table",
]
