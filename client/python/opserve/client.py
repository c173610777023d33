"""The synchronous client."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from opserve import _messages
from opserve._channel import DEFAULT_CHUNK_BYTES, TLS, ClientConfig, Stubs
from opserve._proto import pb
from opserve.dtypes import DTypeLike, encode
from opserve.errors import OpserveError, from_rpc_error
from opserve.graph import Graph
from opserve.types import OpsInfo, RunResult, TensorInfo


class Client:
    """A connection to one opserve server. Every failed call raises OpserveError.

    target: "host:port" or any gRPC target URI.
    token: sent as "authorization: Bearer <token>" (the server's --auth_tokens_file).
    tls: False for plaintext, True for TLS with the system's roots, or a TLS(...).
    session: sent as "x-opserve-session" for a proxy that keeps a session on one replica.
    timeout: the default deadline of each call in seconds (None: none); each call may override it.
    chunk_bytes: payload of each PutTensor/GetTensor message (the server keeps GetTensor's
        between 4 KiB and half its message limit).
    channel_options: extra gRPC channel arguments, e.g. [("grpc.http2.lookahead_bytes", 1 << 24)].

    The channel connects lazily: an unreachable server shows up as UNAVAILABLE from the first
    call. Use as a context manager, or call close().
    """

    def __init__(self, target: str = "127.0.0.1:50051", token: Optional[str] = None,
                 tls: Union[bool, TLS] = False, session: Optional[str] = None,
                 timeout: Optional[float] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 channel_options: Sequence[Tuple[str, Any]] = ()) -> None:
        self._config = ClientConfig(target, token, tls, session, timeout, chunk_bytes,
                                    channel_options)
        self._channel = self._config.channel(grpc)
        self._stubs = Stubs(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def health(self, timeout: Optional[float] = None) -> bool:
        """grpc.health.v1 for the whole server: True when it is SERVING."""
        response = self._call(self._stubs.health_check, pb.HealthCheckRequest(), timeout)
        return _messages.serving(response)

    def ops(self, timeout: Optional[float] = None) -> OpsInfo:
        """The backend, its device, and each op with its dtypes and algorithms."""
        return OpsInfo.from_proto(self._call(self._stubs.list_ops, pb.ListOpsRequest(), timeout))

    def put(self, name: str, array: Any, overwrite: bool = False,
            dtype: Optional[DTypeLike] = None, progress: Optional[_messages.Progress] = None,
            timeout: Optional[float] = None) -> TensorInfo:
        """Stores `array` on the server under `name`, streamed in chunks.

        dtype: by default the array's own, which must be float32, int32 or int64; "bfloat16"
        takes float arrays (rounded to nearest even) or uint16 arrays of raw bfloat16 bits.
        overwrite: replace a tensor of that name (otherwise ALREADY_EXISTS).
        progress: progress(sent_bytes, total_bytes), called after each chunk.
        """
        dt, shape, wire = encode(array, dtype)
        upload = _messages.Upload(name, dt, shape, wire, overwrite, self._config.chunk_bytes,
                                  progress)
        try:
            response = self._call(self._stubs.put_tensor, upload.requests(), timeout)
        except OpserveError:
            if upload.error is not None:
                raise upload.error from None
            raise
        return TensorInfo.from_proto(response.info)

    def get(self, name: str, raw_bfloat16: bool = False,
            progress: Optional[_messages.Progress] = None,
            timeout: Optional[float] = None) -> np.ndarray:
        """The stored tensor `name` as a numpy array, streamed in chunks.

        BFLOAT16 comes back as float32 (exact), or as raw uint16 bits with raw_bfloat16.
        progress: progress(received_bytes, total_bytes), called after each chunk.
        """
        download = _messages.Download(name, raw_bfloat16, progress)
        request = pb.GetTensorRequest(name=name, chunk_bytes=self._config.chunk_bytes)
        call = self._stubs.get_tensor(request, **self._config.call_args(timeout))
        try:
            for response in call:
                download.add(response)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()  # progress or a malformed stream stopped us: the server can stop too
            raise
        return download.array()

    def delete(self, name: str, timeout: Optional[float] = None) -> TensorInfo:
        """Deletes the stored tensor `name`; returns what it was."""
        response = self._call(self._stubs.delete_tensor, pb.DeleteTensorRequest(name=name), timeout)
        return TensorInfo.from_proto(response.info)

    def list(self, timeout: Optional[float] = None) -> List[TensorInfo]:
        """The stored tensors (this token's, when the server has tokens)."""
        response = self._call(self._stubs.list_tensors, pb.ListTensorsRequest(), timeout)
        return [TensorInfo.from_proto(t) for t in response.tensors]

    def run(self, graph: Graph, raw_bfloat16: bool = False,
            timeout: Optional[float] = None) -> RunResult:
        """Executes the graph: its returned outputs as numpy arrays, and per node the algorithm
        that ran and its kernel time, bytes and GB/s. BFLOAT16 outputs as in get()."""
        response = self._call(self._stubs.execute, graph.to_request(), timeout)
        return _messages.run_result(response, raw_bfloat16)

    def _call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        try:
            return method(request, **self._config.call_args(timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

