"""opserve's Python client: tensors resident on a GPU server, graphs of ops run on them.

    import numpy as np, opserve
    with opserve.Client("127.0.0.1:50051") as client:
        client.put("A", np.random.rand(64, 48).astype(np.float32))
        g = opserve.Graph()
        ab = g.matmul(g.stored("A"), g.input("B", b), algorithm="cublas")
        g.output(g.row_mean(g.transpose(ab)), name="mean", store_as="MEAN")
        result = client.run(g)
        result["mean"]          # a numpy array
        result.print_table()    # per node: algorithm, kernel_us, bytes, GB/s

Every op the server lists (client.ops()) is a Graph method, g.<op>(...), or g.op(name, ...).
opserve.aio.Client is the same client for asyncio. Every failed call raises OpserveError with
the gRPC code and the server's message. BFLOAT16 tensors come back as float32 unless
raw_bfloat16=True asks for their uint16 bits.
"""

from opserve import aio  # opserve.aio.Client after a plain `import opserve`
from opserve._channel import DEFAULT_CHUNK_BYTES, TLS
from opserve.client import Client
from opserve.dtypes import DType, bfloat16_bits_to_float32, float32_to_bfloat16_bits
from opserve.errors import OpserveError
from opserve.graph import Graph, Node, Ref
from opserve.types import (AlgorithmInfo, NodeResult, OpInfo, OpsInfo, RunResult, TensorInfo,
                           Timing, format_table)

__version__ = "0.1.0"

__all__ = [
    "AlgorithmInfo", "Client", "aio", "DEFAULT_CHUNK_BYTES", "DType", "Graph", "Node", "NodeResult",
    "OpInfo", "OpsInfo", "OpserveError", "Ref", "RunResult", "TLS", "TensorInfo", "Timing",
    "bfloat16_bits_to_float32", "float32_to_bfloat16_bits", "format_table",
]
