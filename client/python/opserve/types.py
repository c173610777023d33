"""What the server answers, as plain frozen dataclasses (no protobuf types leak out)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, TextIO, Tuple

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

    @classmethod
    def from_proto(cls, info) -> "TensorInfo":
        return cls(info.name, from_number(info.dtype), tuple(info.shape), info.bytes, info.device)


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

    @classmethod
    def from_proto(cls, n) -> "NodeResult":
        return cls(n.id, n.op, n.algorithm, from_number(n.dtype), tuple(n.shape), n.kernel_us,
                   n.bytes, n.flops, n.gbps, n.gflops)


@dataclass(frozen=True)
class Timing:
    """Where an Execute request's time went on the server, in microseconds."""

    queue_us: float    # waiting for the device worker
    input_us: float    # resolving inputs, uploading inline tensors
    compute_us: float  # running the nodes
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

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    def table(self) -> str:
        """The per-node table and the request's timing line, as opserve-cli run prints them."""
        t = self.timing
        return (format_table(self.nodes) + f"\ndevice {self.device}: queue {t.queue_us:.1f} us, "
                f"input {t.input_us:.1f} us, compute {t.compute_us:.1f} us, "
                f"output {t.output_us:.1f} us, total {t.total_us:.1f} us\n")

    def print_table(self, file: Optional[TextIO] = None) -> None:
        print(self.table(), end="", file=file or sys.stdout)


# (header, right-aligned, cell of a NodeResult): the columns of opserve-cli run's table.
_COLUMNS = (
    ("node", False, lambda n: n.id),
    ("op", False, lambda n: n.op),
    ("algorithm", False, lambda n: n.algorithm),
    ("shape", False, lambda n: f"{n.dtype.value}[{','.join(str(d) for d in n.shape)}]"),
    ("kernel_us", True, lambda n: f"{n.kernel_us:.1f}"),
    ("bytes", True, lambda n: str(n.bytes)),
    ("GB/s", True, lambda n: f"{n.gbps:.2f}"),
    ("GFLOP/s", True, lambda n: f"{n.gflops:.2f}"),
)


def format_table(nodes: Sequence[NodeResult]) -> str:
    """Node results as an aligned text table, one line per node under a header line."""
    rows = [[header for header, _, _ in _COLUMNS]]
    rows += [[cell(n) for _, _, cell in _COLUMNS] for n in nodes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if right else c.ljust(w)
                 for c, w, (_, right, _) in zip(row, widths, _COLUMNS)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
