"""What the server answers, as plain frozen dataclasses (no protobuf types leak out)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, TextIO, Tuple

import numpy as np

from opserve.dtypes import DType, from_number


@dataclass(frozen=True)
class TensorInfo:
    """A tensor stored on the server."""

    name: str
    dtype: DType
    shape: Tuple[int, ...]
    bytes: int
    device: str  # e.g. "cpu" or "cuda:0"
    # put only: the server's time from the header to the commit (PutTensorResponse.seconds).
    seconds: float = field(default=0.0, compare=False)

    @classmethod
    def from_proto(cls, info, seconds: float = 0.0) -> "TensorInfo":
        return cls(info.name, from_number(info.dtype), tuple(info.shape), info.bytes, info.device,
                   seconds)


@dataclass(frozen=True)
class AlgorithmInfo:
    name: str
    dtypes: Tuple[DType, ...]  # input dtypes it accepts
    deterministic: bool        # the same input always gives the same bits
    is_default: bool           # what "auto" runs when the shape gives no better choice
    description: str


@dataclass(frozen=True)
class OpInfo:
    name: str
    dtypes: Tuple[DType, ...]
    algorithms: Tuple[AlgorithmInfo, ...]
    default_algorithm: str
    description: str


@dataclass(frozen=True)
class OpsInfo:
    """ListOps: the backend ("cpu" or "cuda"), its device and its ops."""

    backend: str
    device: str
    ops: Tuple[OpInfo, ...]

    @classmethod
    def from_proto(cls, response) -> "OpsInfo":
        def dtypes(numbers) -> Tuple[DType, ...]:
            return tuple(from_number(n) for n in numbers)
        ops = tuple(
            OpInfo(op.name, dtypes(op.dtypes),
                   tuple(AlgorithmInfo(a.name, dtypes(a.dtypes), a.deterministic, a.is_default,
                                       a.description) for a in op.algorithms),
                   op.default_algorithm, op.description)
            for op in response.ops)
        return cls(response.backend, response.device, ops)

    def op(self, name: str) -> OpInfo:
        """The op of that name; KeyError when the server has none."""
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)


@dataclass(frozen=True)
class NodeResult:
    """One node as it ran: the algorithm that actually ran (never "auto") and its cost."""

    id: str
    op: str
    algorithm: str
    dtype: DType            # output dtype
    shape: Tuple[int, ...]  # output shape
    kernel_us: float        # device time of its kernels
    bytes: int              # the minimum the op must read and write
    flops: int
    gbps: float             # bytes / kernel time, 1e9 bytes per second
    gflops: float
    # Fusion: two nodes the server ran as one kernel both report it (algorithm "fused:...", its
    # time, bytes and flops); the one whose work moved names here the node whose kernel ran it,
    # and is "" everywhere else. Sum kernel_us where this is "" to count each kernel once
    # (RunResult.kernel_us does).
    fused_into: str = ""

    @classmethod
    def from_proto(cls, n) -> "NodeResult":
        return cls(n.id, n.op, n.algorithm, from_number(n.dtype), tuple(n.shape), n.kernel_us,
                   n.bytes, n.flops, n.gbps, n.gflops, n.fused_into)


@dataclass(frozen=True)
class Timing:
    """Where an Execute request's time went on the server, in microseconds."""

    queue_us: float    # waiting for the device worker
    input_us: float    # resolving inputs, uploading inline tensors
    compute_us: float  # running the nodes (under load, also the wait for the request before it)
    output_us: float   # downloading returned tensors, storing kept ones
    total_us: float    # from the handler's receipt to the response


@dataclass(frozen=True)
class RunResult:
    """What Client.run returns: ``result["mean"]`` is the output named "mean"."""

    outputs: Dict[str, np.ndarray]  # returned outputs by name (the node's id)
    nodes: Tuple[NodeResult, ...]   # in execution order
    timing: Timing
    stored: Tuple[TensorInfo, ...]  # outputs kept on the server (store_as)
    device: str
    # How the kernels ran (ExecuteResponse.graph): "GRAPH_NOT_USED", "GRAPH_CAPTURED",
    # "GRAPH_REPLAYED" or "GRAPH_REBOUND" (a CUDA graph on the GPU; see the README's --graph_cache).
    graph: str = "GRAPH_NOT_USED"
    # Requests that ran as one launch with this one, itself included (the server's
    # --max_batch_size): 1 when it ran alone. They share input_us, compute_us and output_us.
    batch_size: int = 1

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    @property
    def kernel_us(self) -> float:
        """The device time of the request's kernels, each fused kernel counted once."""
        return sum(n.kernel_us for n in self.nodes if not n.fused_into)

    def table(self) -> str:
        """The per-node table (with a "fused into" column when some node was fused, and the
        kernels' total below it), the request's timing line and how its kernels ran, as
        opserve-cli run prints them."""
        t = self.timing
        graph = _GRAPH_LINES.get(self.graph, "")
        return (format_table(self.nodes) + f"\ndevice {self.device}: queue {t.queue_us:.1f} us, "
                f"input {t.input_us:.1f} us, compute {t.compute_us:.1f} us, "
                f"output {t.output_us:.1f} us, total {t.total_us:.1f} us\n" + graph)

    def print_table(self, file: Optional[TextIO] = None) -> None:
        print(self.table(), end="", file=file or sys.stdout)


# What opserve-cli run prints below the timing line for each way the kernels ran as a CUDA graph.
_GRAPH_LINES = {
    "GRAPH_CAPTURED": "CUDA graph: captured from this request\n",
    "GRAPH_REPLAYED": "CUDA graph: replayed\n",
    "GRAPH_REBOUND": "CUDA graph: replayed, rebound to new tensors\n",
}

# (header, right-aligned, cell of a NodeResult): the columns of opserve-cli run's table; the
# last, "fused into", only when some node was fused.
_COLUMNS = (
    ("node", False, lambda n: n.id),
    ("op", False, lambda n: n.op),
    ("algorithm", False, lambda n: n.algorithm),
    ("shape", False, lambda n: f"{n.dtype.value.lower()}[{', '.join(str(d) for d in n.shape)}]"),
    ("kernel_us", True, lambda n: f"{n.kernel_us:.1f}"),
    ("bytes", True, lambda n: str(n.bytes)),
    ("GB/s", True, lambda n: f"{n.gbps:.2f}"),
    ("GFLOP/s", True, lambda n: f"{n.gflops:.2f}"),
    ("fused into", False, lambda n: n.fused_into),
)


def format_table(nodes: Sequence[NodeResult]) -> str:
    """Node results as an aligned text table, one line per node under a header line, then a
    "total" line: the kernels' time and bytes, a fused kernel counted once (on the node it ran
    for), and the GB/s and GFLOP/s they make."""
    columns = _COLUMNS if any(n.fused_into for n in nodes) else _COLUMNS[:-1]
    rows = [[header for header, _, _ in columns]]
    rows += [[cell(n) for _, _, cell in columns] for n in nodes]
    kernels = [n for n in nodes if not n.fused_into]
    us = sum(n.kernel_us for n in kernels)
    moved = sum(n.bytes for n in kernels)
    flops = sum(n.flops for n in kernels)
    total = ["total", "", "", "", f"{us:.1f}", str(moved),
             f"{moved / us / 1e3 if us > 0 else 0:.2f}", f"{flops / us / 1e3 if us > 0 else 0:.2f}"]
    rows.append(total + [""] * (len(columns) - len(total)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if right else c.ljust(w)
                 for c, w, (_, right, _) in zip(row, widths, columns)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GraphTensor:
    """An input or output of a saved graph: -1 in its shape takes any size."""

    name: str
    dtype: DType
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class GraphInfo:
    """A saved graph (Client.save_graph): its inputs by inline-tensor name, its outputs by node."""

    name: str
    inputs: Tuple[GraphTensor, ...]
    outputs: Tuple[GraphTensor, ...]
    nodes: int

    @classmethod
    def from_proto(cls, info) -> "GraphInfo":
        def tensors(ts) -> Tuple[GraphTensor, ...]:
            return tuple(GraphTensor(t.name, from_number(t.dtype), tuple(t.shape)) for t in ts)
        return cls(info.name, tensors(info.inputs), tensors(info.outputs), info.nodes)


@dataclass(frozen=True)
class SavedRunResult:
    """What Client.run_saved returns: ``result["mean"]`` is the output of the node "mean".

    parameters: the server's figures, by the Open Inference Protocol's parameter names:
    "<node>.algorithm", "<node>.kernel_us", "<node>.gbps", "<node>.fused_into" per node, and
    "kernel_us" (each fused kernel once), "compute_us", "queue_us", "batch_size".
    """

    outputs: Dict[str, np.ndarray]
    parameters: Dict[str, Any]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    @property
    def kernel_us(self) -> float:
        return float(self.parameters.get("kernel_us", 0.0))
