"""What the sync and asyncio clients share: options, the channel, the method table, metadata."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Tuple, Union

import grpc

from opserve._proto import pb
from opserve._retry import Deadline, Retry, policy_of
from opserve.errors import OpserveError

# Chunk payload per PutTensor/GetTensor message, as the C++ client's (client/TUNING.md): 4 MiB
# less one page keeps a message with its framing under gRPC's default 4 MiB receive limit.
DEFAULT_CHUNK_BYTES = (4 << 20) - 4096

PemSource = Union[str, "os.PathLike[str]", bytes]


@dataclass(frozen=True)
class TLS:
    """TLS settings. Each PEM is a file path or the PEM bytes themselves.

    root_ca: the CA that signed the server's certificate (None: the system's roots).
    client_cert and client_key: for a server that asks for client certificates (mutual TLS).
    server_name: the name to check the server's certificate against, when not the target's host.
    """

    root_ca: Optional[PemSource] = None
    client_cert: Optional[PemSource] = None
    client_key: Optional[PemSource] = None
    server_name: Optional[str] = None


def _pem(source: Optional[PemSource]) -> Optional[bytes]:
    if source is None or isinstance(source, bytes):
        return source
    with open(source, "rb") as f:
        return f.read()


# attribute: (multicallable kind, method path, request class, response class)
_METHODS = {
    "put_tensor": ("stream_unary", "/opserve.v1.OpServe/PutTensor", "PutTensorRequest", "PutTensorResponse"),
    "get_tensor": ("unary_stream", "/opserve.v1.OpServe/GetTensor", "GetTensorRequest", "GetTensorResponse"),
    "delete_tensor": ("unary_unary", "/opserve.v1.OpServe/DeleteTensor", "DeleteTensorRequest",
                      "DeleteTensorResponse"),
    "list_tensors": ("unary_unary", "/opserve.v1.OpServe/ListTensors", "ListTensorsRequest",
                     "ListTensorsResponse"),
    "move_tensor": ("unary_unary", "/opserve.v1.OpServe/MoveTensor", "MoveTensorRequest",
                    "MoveTensorResponse"),
    "execute": ("unary_unary", "/opserve.v1.OpServe/Execute", "ExecuteRequest", "ExecuteResponse"),
    "list_ops": ("unary_unary", "/opserve.v1.OpServe/ListOps", "ListOpsRequest", "ListOpsResponse"),
    "save_graph": ("unary_unary", "/opserve.v1.OpServe/SaveGraph", "SaveGraphRequest",
                   "SaveGraphResponse"),
    "delete_graph": ("unary_unary", "/opserve.v1.OpServe/DeleteGraph", "DeleteGraphRequest",
                     "DeleteGraphResponse"),
    "list_graphs": ("unary_unary", "/opserve.v1.OpServe/ListGraphs", "ListGraphsRequest",
                    "ListGraphsResponse"),
    # The Open Inference Protocol: a saved graph runs by name as a model, and system shared
    # memory regions are registered there.
    "model_infer": ("unary_unary", "/inference.GRPCInferenceService/ModelInfer",
                    "ModelInferRequest", "ModelInferResponse"),
    "shm_register": ("unary_unary", "/inference.GRPCInferenceService/SystemSharedMemoryRegister",
                     "SystemSharedMemoryRegisterRequest",
                     "SystemSharedMemoryRegisterResponse"),
    "shm_unregister": ("unary_unary",
                       "/inference.GRPCInferenceService/SystemSharedMemoryUnregister",
                       "SystemSharedMemoryUnregisterRequest",
                       "SystemSharedMemoryUnregisterResponse"),
    "health_check": ("unary_unary", "/grpc.health.v1.Health/Check", "HealthCheckRequest",
                     "HealthCheckResponse"),
}


class Stubs:
    """One multicallable per method, on a grpc or grpc.aio channel alike (same factory methods)."""

    def __init__(self, channel: Any) -> None:
        for attribute, (kind, path, request, response) in _METHODS.items():
            setattr(self, attribute, getattr(channel, kind)(
                path, request_serializer=getattr(pb, request).SerializeToString,
                response_deserializer=getattr(pb, response).FromString))


class ClientConfig:
    """The constructor arguments both clients take, checked once, and the channel they imply."""

    def __init__(self, target: str, token: Optional[str], tls: Union[bool, TLS],
                 session: Union[None, bool, str], timeout: Optional[float],
                 unary_timeout: Optional[float], retry: Union[bool, Retry, None],
                 chunk_bytes: int, channel_options: Sequence[Tuple[str, Any]]) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        for what, seconds in (("timeout", timeout), ("unary_timeout", unary_timeout)):
            if seconds is not None and not seconds > 0:
                raise ValueError(f"{what} must be None or seconds > 0, got {seconds}")
        self.target = target
        self.timeout = timeout
        self.unary_timeout = unary_timeout
        self.retry = policy_of(retry)
        self.chunk_bytes = chunk_bytes
        self.tls = TLS() if tls is True else (tls or None)
        self.session = new_session_id() if session is True else (session or None)
        metadata = []
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        if self.session:
            # A proxy hashes it to keep a session's calls, and its tensors, on one replica.
            metadata.append(("x-opserve-session", self.session))
        self.metadata = tuple(metadata)
        # Execute may return tensors far beyond gRPC's default 4 MiB receive limit.
        self.options = [("grpc.max_receive_message_length", -1),
                        ("grpc.max_send_message_length", -1),
                        # GetTensor's messages are read on the calling thread: by default grpcio
                        # hands every message of a unary-stream call to the channel's one polling
                        # thread, which must win the GIL from every caller's thread for each
                        # (a get's p50 was 25x the server's time under 32 threads).
                        ("SingleThreadedUnaryStream", 1), *channel_options]
        if self.tls and self.tls.server_name:
            self.options.append(("grpc.ssl_target_name_override", self.tls.server_name))

    def channel(self, grpc_module: Any) -> Any:
        """A channel from `grpc` or `grpc.aio` (both spell these functions alike)."""
        if self.tls is None:
            return grpc_module.insecure_channel(self.target, options=self.options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_pem(self.tls.root_ca), private_key=_pem(self.tls.client_key),
            certificate_chain=_pem(self.tls.client_cert))
        return grpc_module.secure_channel(self.target, credentials, options=self.options)

    def deadline(self, timeout: Optional[float], unary: bool) -> Deadline:
        """A call's deadline: its own timeout, else the client's, else for a unary call that runs
        no graph the unary default (a server that accepts and never answers must not hang it)."""
        if timeout is None:
            timeout = self.timeout
        if timeout is None and unary:
            timeout = self.unary_timeout
        return Deadline(timeout)

    def backoffs(self, safe: bool) -> Iterator[float]:
        """The waits before each retry of a call: none for a call that is not safe to repeat."""
        return self.retry.backoffs() if safe else iter(())


def new_session_id() -> str:
    """A session id no other client will draw: 128 random bits."""
    return uuid.uuid4().hex


def retry_wait(error: OpserveError, backoffs: Iterator[float], deadline: Deadline,
               codes: Sequence[grpc.StatusCode]) -> Optional[float]:
    """How long to wait before trying a failed call again, or None to give up with `error`."""
    if error.code not in codes:
        return None
    wait = next(backoffs, None)
    if wait is None or not deadline.allows_wait(wait):
        return None
    return wait
