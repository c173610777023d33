"""What the server answers, as plain frozen dataclasses (no protobuf types leak out)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, TextIO, Tuple

import numpy as np

from opserve.dtypes import DType, from_number


@dataclass(frozen=True)
class TensorShard:
    """One part of a sharded tensor: rows [row_begin, row_begin + rows) of it, on `device`."""

    device: str
    row_begin: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class TensorInfo:
    """A tensor stored on the server."""

    name: str
    dtype: DType
    shape: Tuple[int, ...]
    bytes: int
    # Where it lives: "cpu", "cpu:1", "cuda:0"; a sharded tensor's devices comma-separated
    # ("cuda:0,cuda:1"), its parts in `shards`.
    device: str
    # put only: the server's time from the header to the commit (PutTensorResponse.seconds).
    seconds: float = field(default=0.0, compare=False)
    shards: Tuple[TensorShard, ...] = ()  # empty unless sharded (put(..., shard=True))

    @classmethod
    def from_proto(cls, info, seconds: float = 0.0) -> "TensorInfo":
        shards = tuple(TensorShard(s.device, s.row_begin, s.rows, s.bytes) for s in info.shards)
        return cls(info.name, from_number(info.dtype), tuple(info.shape), info.bytes, info.device,
                   seconds, shards)

    @property
    def sharded(self) -> bool:
        return bool(self.shards)


@dataclass(frozen=True)
class MoveResult:
    """What Client.move returns: where the tensor lives now, the bytes copied between devices
    (0: it was there already) and the server's time for it."""

    info: TensorInfo
    bytes: int
    seconds: float

    @classmethod
    def from_proto(cls, response) -> "MoveResult":
        return cls(TensorInfo.from_proto(response.info), response.bytes, response.seconds)


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
class DeviceInfo:
    """One device the server serves (ListOpsResponse.devices)."""

    name: str         # "cuda:0", "cpu:1": what put(device=), move() and output(device=) take
    description: str  # e.g. "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)"
    capability: str   # "sm_90"; "cpu" on the CPU backend
    memory_total: int
    memory_budget: int  # what the server may hold on it (its --memory_budget, per device)
    memory_used: int
    serving: bool       # False once a sticky device error took it out
    error: str          # why not serving
    algorithms: Tuple[str, ...]  # the "op/algorithm" rows it runs

    @classmethod
    def from_proto(cls, d) -> "DeviceInfo":
        return cls(d.name, d.description, d.capability, d.memory_total, d.memory_budget,
                   d.memory_used, d.serving, d.error, tuple(d.algorithms))


@dataclass(frozen=True)
class OpsInfo:
    """ListOps: the backend ("cpu" or "cuda"), its first device's description, its ops (what
    any device runs) and every device it serves."""

    backend: str
    device: str
    ops: Tuple[OpInfo, ...]
    devices: Tuple[DeviceInfo, ...] = ()

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
        return cls(response.backend, response.device, ops,
                   tuple(DeviceInfo.from_proto(d) for d in response.devices))

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
    # Copies between devices: stored inputs from other devices than the one the graph ran on,
    # outputs kept on another (OutputSpec.device).
    peer_copy_us: float = 0.0


@dataclass(frozen=True)
class RunResult:
    """What Client.run returns: ``result["mean"]`` is the output named "mean"."""

    outputs: Dict[str, np.ndarray]  # returned outputs by name (the node's id)
    nodes: Tuple[NodeResult, ...]   # in execution order
    timing: Timing
    stored: Tuple[TensorInfo, ...]  # outputs kept on the server (store_as)
    device: str  # where it ran ("cpu:1"); a sharded run: its devices, "cpu:0,cpu:1"
    # How the kernels ran (ExecuteResponse.graph): "GRAPH_NOT_USED", "GRAPH_CAPTURED",
    # "GRAPH_REPLAYED" or "GRAPH_REBOUND" (a CUDA graph on the GPU; see the README's --graph_cache).
    graph: str = "GRAPH_NOT_USED"
    # Requests that ran as one launch with this one, itself included (the server's
    # --max_batch_size): 1 when it ran alone. They share input_us, compute_us and output_us.
    batch_size: int = 1
    # Bytes copied between devices: stored inputs from other devices, outputs kept on another
    # (timing.peer_copy_us: how long it took).
    peer_copy_bytes: int = 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    @property
    def peer_copy_us(self) -> float:
        return self.timing.peer_copy_us

    @property
    def kernel_us(self) -> float:
        """The device time of the request's kernels, each fused kernel counted once."""
        return sum(n.kernel_us for n in self.nodes if not n.fused_into)

    def table(self) -> str:
        """The per-node table (with a "fused into" column when some node was fused, and the
        kernels' total below it), the request's timing line and how its kernels ran, as
        opserve-cli run prints them."""
        t = self.timing
        peer = ""
        if self.peer_copy_bytes or t.peer_copy_us:
            peer = (f"peer copies: {format_bytes(self.peer_copy_bytes)} in "
                    f"{t.peer_copy_us:.1f} us\n")
        graph = _GRAPH_LINES.get(self.graph, "")
        return (format_table(self.nodes) + f"\ndevice {self.device}: queue {t.queue_us:.1f} us, "
                f"input {t.input_us:.1f} us, compute {t.compute_us:.1f} us, "
                f"output {t.output_us:.1f} us, total {t.total_us:.1f} us\n" + peer + graph)

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


def format_bytes(n: int) -> str:
    """A byte count as opserve-cli writes it: "80 B", "12.0 KiB", "1.00 GiB"."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


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
