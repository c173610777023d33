"""Requests built and responses read the same way by the sync and asyncio clients."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import grpc
import numpy as np

from opserve._proto import pb
from opserve import _cast
from opserve.dtypes import OIP_NAME, DType, decode, encode, from_number, to_number
from opserve.errors import OpserveError
from opserve.types import NodeResult, RunResult, SavedRunResult, TensorInfo, Timing

# progress(done_bytes, total_bytes), after each chunk.
Progress = Callable[[int, int], None]


class Placement:
    """Where put places a tensor: PutTensorHeader.device and .shard, checked before sending."""

    def __init__(self, name: str, device: Optional[str], shard: bool) -> None:
        if device is not None and not isinstance(device, str):
            raise TypeError(f"put {name!r}: device must be a device name such as 'cuda:1', "
                            f"got {type(device).__name__}")
        if shard and device:
            raise ValueError(f"put {name!r}: shard=True spreads the tensor over every device; "
                             f"it takes no device (got {device!r})")
        self.device = device or ""
        self.shard = bool(shard)


class Upload:
    """PutTensor's stream: the header, then the data in chunks of at most chunk_bytes.

    progress is called as each chunk is handed to gRPC, which sends it under flow control: when
    it reports the last byte, the data is on its way, not yet committed. gRPC turns an exception
    raised while it iterates the requests into a bare UNKNOWN status, so one raised by progress
    is kept in `error` for the client to raise in its place.
    """

    def __init__(self, name: str, dtype: DType, shape: Tuple[int, ...], wire: np.ndarray,
                 overwrite: bool, placement: "Placement", chunk_bytes: int,
                 progress: Optional[Progress]) -> None:
        self._header = pb.PutTensorHeader(name=name, dtype=to_number(dtype), shape=shape,
                                          overwrite=overwrite, device=placement.device,
                                          shard=placement.shard)
        self._data = wire.reshape(-1).view(np.uint8)
        self._chunk_bytes = chunk_bytes
        self._progress = progress
        self.error: Optional[BaseException] = None

    def requests(self) -> Iterator[Any]:
        yield pb.PutTensorRequest(header=self._header)
        total = self._data.nbytes
        for offset in range(0, total, self._chunk_bytes):
            chunk = self._data[offset:offset + self._chunk_bytes]
            yield pb.PutTensorRequest(chunk=chunk.tobytes())
            self._report(offset + chunk.nbytes, total)
        if total == 0:
            self._report(0, 0)  # an empty tensor: no chunk, still one report that it is done

    def _report(self, done: int, total: int) -> None:
        if self._progress:
            try:
                self._progress(done, total)
            except BaseException as e:
                self.error = e
                raise


class Download:
    """GetTensor's stream, received into one preallocated buffer."""

    def __init__(self, name: str, raw_bfloat16: bool, progress: Optional[Progress]) -> None:
        self._name = name
        self._raw_bfloat16 = raw_bfloat16
        self._progress = progress
        self._info: Optional[TensorInfo] = None
        self._buffer = np.empty(0, np.uint8)
        self._received = 0

    def add(self, response: Any) -> None:
        kind = response.WhichOneof("kind")
        if kind == "info" and self._info is None:
            self._info = TensorInfo.from_proto(response.info)
            self._buffer = np.empty(self._info.bytes, np.uint8)
        elif kind == "chunk" and self._info is not None:
            end = self._received + len(response.chunk)
            if end > self._buffer.nbytes:
                raise self._data_loss(f"more than the {self._buffer.nbytes} bytes announced")
            self._buffer[self._received:end] = np.frombuffer(response.chunk, np.uint8)
            self._received = end
            if self._progress:
                self._progress(end, self._buffer.nbytes)
        else:
            raise self._data_loss(f"unexpected {kind or 'empty'} message")

    def array(self) -> np.ndarray:
        if self._info is None:
            raise self._data_loss("the stream ended before the tensor's info")
        if self._received != self._buffer.nbytes:
            raise self._data_loss(f"{self._received} of {self._buffer.nbytes} bytes received")
        if self._progress and self._received == 0:
            self._progress(0, 0)  # an empty tensor: no chunk, still one report that it is done
        return decode(self._info.dtype, self._info.shape, self._buffer, self._raw_bfloat16)

    def _data_loss(self, what: str) -> OpserveError:
        return OpserveError(grpc.StatusCode.DATA_LOSS, f"GetTensor {self._name!r}: {what}")


def shm_array(name: str, responses: Any, region: Any, raw_bfloat16: bool) -> np.ndarray:
    """A GetTensor into a region: the stream is the info alone, the bytes are in the region."""
    infos = [r.info for r in responses if r.WhichOneof("kind") == "info"]
    if len(infos) != 1 or len(infos) != len(responses):
        raise OpserveError(grpc.StatusCode.DATA_LOSS, f"GetTensor {name!r} into shared memory: "
                           f"expected the info message alone, got {len(responses)} messages")
    info = TensorInfo.from_proto(infos[0])
    if info.bytes > region.nbytes:
        raise OpserveError(grpc.StatusCode.DATA_LOSS, f"GetTensor {name!r}: {info.bytes} bytes "
                           f"do not fit the {region.nbytes}-byte region")
    return decode(info.dtype, info.shape, region.read(info.bytes), raw_bfloat16)


def run_result(response: Any, raw_bfloat16: bool) -> RunResult:
    outputs = {o.node: decode(from_number(o.tensor.dtype), tuple(o.tensor.shape), o.tensor.data,
                              raw_bfloat16) for o in response.outputs}
    t = response.timing
    return RunResult(outputs=outputs,
                     nodes=tuple(NodeResult.from_proto(n) for n in response.nodes),
                     timing=Timing(t.queue_us, t.input_us, t.compute_us, t.output_us, t.total_us,
                                   t.peer_copy_us),
                     stored=tuple(TensorInfo.from_proto(i) for i in response.stored),
                     device=response.device,
                     graph=pb.graph_replay_name.get(response.graph, str(response.graph)),
                     batch_size=response.batch_size or 1,
                     peer_copy_bytes=response.peer_copy_bytes)


def put_header(name: str, dtype: DType, shape: Tuple[int, ...], overwrite: bool,
               placement: Placement, shm: Any) -> Any:
    """PutTensor's whole stream when the bytes are in a region: the header alone."""
    return pb.PutTensorRequest(header=pb.PutTensorHeader(
        name=name, dtype=to_number(dtype), shape=shape, overwrite=overwrite,
        device=placement.device, shard=placement.shard, shm=shm))


def stores_only_with_overwrite(request: Any) -> bool:
    """Whether running an ExecuteRequest twice leaves what running it once does: it stores
    nothing, or overwrites what it stores (a retry of it is then safe)."""
    return all(o.overwrite or not o.store_as for o in request.outputs)


# The Open Inference Protocol's datatype names come from the one dtype table (dtypes.TABLE).
_FROM_OIP_NAME = {v: k for k, v in OIP_NAME.items()}


def infer_request(name: str, inputs: Mapping[str, Any], cast: bool) -> Any:
    """ModelInfer for the saved graph `name`: each input's bytes as raw_input_contents."""
    request = pb.ModelInferRequest(model_name=name)
    for input_name, array in inputs.items():
        what = f"saved graph {name!r} input {input_name!r}"
        dt, shape, wire = encode(_cast.prepare(array, None, cast, what))
        request.inputs.add(name=input_name, datatype=OIP_NAME[dt], shape=shape)
        request.raw_input_contents.append(wire.tobytes())
    return request


def _parameter(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def saved_run_result(response: Any, raw_bfloat16: bool) -> SavedRunResult:
    outputs: Dict[str, np.ndarray] = {}
    for i, o in enumerate(response.outputs):
        dtype = _FROM_OIP_NAME.get(o.datatype)
        if dtype is None:
            raise OpserveError(grpc.StatusCode.UNIMPLEMENTED,
                               f"output {o.name!r}: datatype {o.datatype} is not one this client "
                               "can decode")
        data = response.raw_output_contents[i] if i < len(response.raw_output_contents) else b""
        if "opserve_stored_as" in o.parameters:
            continue  # kept on the server, not sent
        outputs[o.name] = decode(dtype, tuple(o.shape), data, raw_bfloat16)
    parameters = {k: _parameter(v) for k, v in response.parameters.items()}
    return SavedRunResult(outputs=outputs, parameters=parameters)


def serving(response: Any) -> bool:
    return pb.serving_status_name.get(response.status) == "SERVING"
