"""A graph builder that reads like the math, compiled to one ExecuteRequest.

    g = opserve.Graph()
    ab = g.matmul(g.stored("A"), g.input("B", b))
    g.output(g.row_mean(g.transpose(ab)), name="mean", store_as="MEAN")
    result = client.run(g)          # result["mean"], result.nodes

Every op the server lists (ListOps) is a method, ``g.<op>(inputs..., algorithm=, id=, attrs)``,
or ``g.op(name, ...)``: the builder keeps no op list of its own.
Nodes get ids from their op ("matmul_0", "transpose_1", ...) unless given one (``id=``);
``output(name=...)`` names the node it returns, so the name is also the id the server reports
in the node table.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from opserve import _cast
from opserve._proto import pb
from opserve.dtypes import DTypeLike, dtype_of, encode, to_number

AttrValue = Union[bool, int, float, str]


class Ref:
    """Something a node can take as an input: a stored tensor, an inline one, or a node."""

    def __init__(self, graph: "Graph", source: str, name: str) -> None:
        self._graph = graph
        self._source = source  # the Input oneof's field: "stored", "inline_name" or "node"
        self.name = name

    def __repr__(self) -> str:
        return f"<opserve.{type(self).__name__} {self._source} {self.name!r}>"


class Node(Ref):
    """An op applied to inputs; its ``name`` is its node id."""

    def __init__(self, graph: "Graph", node_id: str, named: bool, op: str, inputs: Tuple[Ref, ...],
                 algorithm: Optional[str], attrs: Dict[str, AttrValue]) -> None:
        super().__init__(graph, "node", node_id)
        self.named = named  # given an id by the caller: output() may not rename it
        self.op = op
        self.inputs = inputs
        self.algorithm = algorithm or ""
        self.attrs = attrs


def _attr(key: str, value: AttrValue) -> Any:
    # bool first: True is also an int.
    if isinstance(value, bool):
        return pb.AttrValue(b=value)
    if isinstance(value, int):
        return pb.AttrValue(i=value)
    if isinstance(value, float):
        return pb.AttrValue(f=value)
    if isinstance(value, str):
        return pb.AttrValue(s=value)
    raise TypeError(f"attribute {key!r}: {type(value).__name__} is not bool, int, float or str")


class Graph:
    """Nodes, the inline tensors they read and the outputs wanted; ``Client.run`` sends it."""

    def __init__(self) -> None:
        self._nodes: List[Node] = []
        self._inline: Dict[str, Any] = {}  # name -> Tensor message
        self._outputs: List[Any] = []      # (node, OutputSpec fields)

    # ---- inputs ----
    def stored(self, name: str) -> Ref:
        """A tensor stored on the server (uploaded with Client.put, or kept by an earlier run)."""
        return Ref(self, "stored", name)

    def input(self, name: str, array: Any = None, dtype: Optional[DTypeLike] = None,
              shape: Optional[Sequence[int]] = None, cast: bool = False) -> Ref:
        """A tensor sent with the request under `name` (a tensor name), not kept on the server.

        dtype as for Client.put: by default the array's own (float32, int32 or int64); cast=True
        converts other numpy dtypes to the nearest (float64 -> float32, ...).
        With no array, a graph to save (Client.save_graph) declares an input of its model:
        dtype and shape are then required, and -1 in the shape takes any size.
        """
        if name in self._inline:
            raise ValueError(f"inline tensor {name!r} is already in the graph")
        if array is None:
            if dtype is None or shape is None:
                raise ValueError(f"input {name!r}: without an array, dtype= and shape= declare it")
            tensor = pb.Tensor(dtype=to_number(dtype_of(dtype)), shape=[int(d) for d in shape])
        else:
            if shape is not None:
                raise ValueError(f"input {name!r}: the array gives the shape; shape= is for a "
                                 "declared input")
            array = _cast.prepare(array, dtype, cast, f"input {name!r}")
            dt, dims, wire = encode(array, dtype)
            tensor = pb.Tensor(dtype=to_number(dt), shape=dims, data=wire.tobytes())
        self._inline[name] = tensor
        return Ref(self, "inline_name", name)

    # ---- ops ----
    def op(self, op: str, *inputs: Ref, algorithm: Optional[str] = None, id: Optional[str] = None,
           **attrs: AttrValue) -> Node:
        """Any op by name (ListOps lists them); ``g.<op>(...)`` is this with the name filled.

        algorithm: the one to run (e.g. "cublas"); None or "auto" lets the server choose, and the
        result's NodeResult says which it chose. attrs: the op's attributes, if it has any.
        """
        for i, ref in enumerate(inputs):
            if not isinstance(ref, Ref):
                raise TypeError(f"{op} input {i}: expected a graph input or node, got "
                                f"{type(ref).__name__} (use g.stored(name) or g.input(name, array))")
            if ref._graph is not self:
                raise ValueError(f"{op} input {i}: {ref!r} belongs to another graph")
        for key, value in attrs.items():
            _attr(key, value)  # refuses a bad value here, where the caller made it
        node_id = id if id is not None else f"{op}_{len(self._nodes)}"
        node = Node(self, node_id, id is not None, op, inputs, algorithm, attrs)
        self._nodes.append(node)
        return node

    def __getattr__(self, op: str) -> Any:
        """Every op of the server's table as a method: ``g.row_sum(x, algorithm=...)`` is
        ``g.op("row_sum", x, algorithm=...)``. The builder keeps no op list: ListOps says which
        ops the server has, and the server refuses a name it lacks when the graph runs
        (INVALID_ARGUMENT, "unknown op", naming it)."""
        if op.startswith("_"):
            raise AttributeError(op)

        def method(*inputs: Ref, **kwargs: Any) -> Node:
            return self.op(op, *inputs, **kwargs)
        method.__name__ = method.__qualname__ = op
        return method

    # ---- outputs ----
    def output(self, node: Node, name: Optional[str] = None, store_as: Optional[str] = None,
               overwrite: bool = False, return_inline: bool = True,
               device: Optional[str] = None) -> Node:
        """Asks for a node's result: returned (under `name`, default the node's id), kept on the
        server under `store_as` (replacing a tensor of that name only with overwrite), or both.
        device: the device store_as keeps it on ("cuda:1"); None: where the node ran.
        """
        if not isinstance(node, Node) or node._graph is not self:
            raise ValueError(f"output: {node!r} is not a node of this graph")
        if not return_inline and not store_as:
            raise ValueError(f"output {node.name!r}: neither returned nor stored")
        if device and not store_as:
            raise ValueError(f"output {node.name!r}: device={device!r} places what store_as "
                             "keeps; this output stores nothing")
        if name is not None and name != node.name:
            if node.named or any(spec[0] is node for spec in self._outputs):
                raise ValueError(f"output: node {node.name!r} already has that name; "
                                 f"cannot also be {name!r}")
            node.name = name
            node.named = True
        self._outputs.append((node, return_inline, store_as or "", overwrite, device or ""))
        return node

    def to_request(self) -> Any:
        """The graph as the opserve.v1.ExecuteRequest message Client.run sends."""
        duplicates = sorted(i for i, k in Counter(n.name for n in self._nodes).items() if k > 1)
        if duplicates:
            raise ValueError(f"node ids used twice: {', '.join(duplicates)}")
        request = pb.ExecuteRequest()
        for n in self._nodes:
            node = request.nodes.add(id=n.name, op=n.op, algorithm=n.algorithm)
            for ref in n.inputs:
                node.inputs.add(**{ref._source: ref.name})
            for key, value in n.attrs.items():
                node.attrs[key].CopyFrom(_attr(key, value))
        for name, tensor in self._inline.items():
            request.inline_tensors[name].CopyFrom(tensor)
        for node, return_inline, store_as, overwrite, device in self._outputs:
            request.outputs.add(node=node.name, return_inline=return_inline, store_as=store_as,
                                overwrite=overwrite, device=device)
        return request
