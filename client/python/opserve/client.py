"""The synchronous client."""

from __future__ import annotations

import contextlib
import time
from typing import (Any, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc
import numpy as np

from opserve import _cast, _messages, _shm, _stream
from opserve._channel import DEFAULT_CHUNK_BYTES, TLS, ClientConfig, Stubs, retry_wait
from opserve._proto import pb
from opserve._retry import Retry
from opserve.dtypes import DTypeLike, encode
from opserve.errors import OpserveError, from_rpc_error
from opserve.graph import Graph
from opserve.types import (DeviceInfo, GraphInfo, MoveResult, OpsInfo, RunResult,
                           SavedRunResult, TensorInfo)

T = TypeVar("T")


class Client:
    """A connection to one opserve server. Every failed call raises OpserveError.

    target: "host:port" or any gRPC target URI.
    token: sent as "authorization: Bearer <token>" (the server's --auth_tokens_file).
    tls: False for plaintext, True for TLS with the system's roots, or a TLS(...).
    session: an id sent as "x-opserve-session" on every call, for a proxy that keeps a session's
        calls (and its tensors) on one replica; True draws a new id (the `session` attribute).
    timeout: the deadline of every call in seconds (None: see unary_timeout); a call's own
        timeout= overrides it. It covers all of a call's retries.
    chunk_bytes: payload of each PutTensor/GetTensor message (the server keeps GetTensor's
        between 4 KiB and half its message limit).
    channel_options: extra gRPC channel arguments, e.g. [("grpc.http2.lookahead_bytes", 1 << 24)].
    unary_timeout: the deadline of the calls that neither run a graph nor stream a tensor
        (health, ops, list, delete, graphs...) when neither they nor `timeout` set one: 30 s, so
        that a server that accepts and never answers fails with DEADLINE_EXCEEDED. None: none.
    retry: True (opserve.Retry()'s bounded backoff on RESOURCE_EXHAUSTED and UNAVAILABLE, for
        the calls safe to repeat), False, or a Retry(...) of your own.

    The channel connects lazily: an unreachable server shows up as UNAVAILABLE from the first
    call. Use as a context manager, or call close().
    """

    def __init__(self, target: str = "127.0.0.1:50051", token: Optional[str] = None,
                 tls: Union[bool, TLS] = False, session: Union[None, bool, str] = None,
                 timeout: Optional[float] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 unary_timeout: Optional[float] = 30.0, retry: Union[bool, Retry] = True) -> None:
        self._config = ClientConfig(target, token, tls, session, timeout, unary_timeout, retry,
                                    chunk_bytes, channel_options)
        self.session = self._config.session
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
        response = self._unary(self._stubs.health_check, pb.HealthCheckRequest(), timeout)
        return _messages.serving(response)

    def ops(self, timeout: Optional[float] = None) -> OpsInfo:
        """The backend, its device, and each op with its dtypes and algorithms."""
        return OpsInfo.from_proto(self._unary(self._stubs.list_ops, pb.ListOpsRequest(), timeout))

    def devices(self, timeout: Optional[float] = None) -> Tuple[DeviceInfo, ...]:
        """The server's devices: name, memory used, budget and total, whether it serves
        (ops().devices)."""
        return self.ops(timeout).devices

    def put(self, name: str, array: Any, overwrite: bool = False,
            dtype: Optional[DTypeLike] = None, cast: bool = False, shm: bool = False,
            progress: Optional[_messages.Progress] = None,
            timeout: Optional[float] = None, device: Optional[str] = None,
            shard: bool = False) -> TensorInfo:
        """Stores `array` on the server under `name`, streamed in chunks.

        dtype: by default the array's own, which must be float32, int32 or int64; "bfloat16"
        takes float arrays (rounded to nearest even) or uint16 arrays of raw bfloat16 bits.
        cast: convert other numpy dtypes to the nearest the server takes (float64 -> float32,
        small and unsigned ints -> int32 or int64); without it they are refused.
        overwrite: replace a tensor of that name (otherwise ALREADY_EXISTS).
        shm: move the bytes through a shared-memory region instead of the socket (the server
        must be on this host).
        progress: progress(sent_bytes, total_bytes), called after each chunk.
        device: the server's device to keep it on ("cuda:1", "cpu:0"; as devices() names
        them); None: the serving device with the most free memory.
        shard: split a [rows, cols] array by rows over every serving device (no device then);
        the result's `shards` says which rows went where.
        The result's `seconds` is the server's time from the header to the commit.
        """
        placement = _messages.Placement(name, device, shard)
        dt, shape, wire = encode(_cast.prepare(array, dtype, cast, f"put {name!r}"), dtype)
        if shm:
            with self._region(wire.nbytes, timeout, "put") as region:
                region.write(0, wire.reshape(-1).view(np.uint8))
                request = _messages.put_header(name, dt, shape, overwrite, placement,
                                               region.ref(0, wire.nbytes))
                # A fresh stream of the one header for each try.
                response = self._unary(self._stubs.put_tensor, lambda: iter((request,)), timeout,
                                       unary=False, safe=overwrite)
            if progress:
                progress(wire.nbytes, wire.nbytes)
            return TensorInfo.from_proto(response.info, response.seconds)

        def attempt(remaining: Optional[float]) -> TensorInfo:
            upload = _messages.Upload(name, dt, shape, wire, overwrite, placement,
                                      self._config.chunk_bytes, progress)
            try:
                response = self._stubs.put_tensor(upload.requests(), timeout=remaining,
                                                  metadata=self._config.metadata)
            except grpc.RpcError as e:
                if upload.error is not None:
                    raise upload.error from None
                raise from_rpc_error(e) from None
            return TensorInfo.from_proto(response.info, response.seconds)
        return self._retrying(attempt, timeout, unary=False, safe=overwrite)

    def get(self, name: str, raw_bfloat16: bool = False, shm: bool = False,
            progress: Optional[_messages.Progress] = None,
            timeout: Optional[float] = None) -> np.ndarray:
        """The stored tensor `name` as a numpy array, streamed in chunks.

        BFLOAT16 comes back as float32 (exact), or as raw uint16 bits with raw_bfloat16.
        shm: receive the bytes through a shared-memory region (the server on this host).
        progress: progress(received_bytes, total_bytes), called after each chunk.
        """
        if shm:
            return self._get_shm(name, raw_bfloat16, progress, timeout)

        def attempt(remaining: Optional[float]) -> np.ndarray:
            download = _messages.Download(name, raw_bfloat16, progress)
            request = pb.GetTensorRequest(name=name, chunk_bytes=self._config.chunk_bytes)
            call = self._stubs.get_tensor(request, timeout=remaining,
                                          metadata=self._config.metadata)
            try:
                for response in call:
                    download.add(response)
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
            except BaseException:
                call.cancel()  # progress or a malformed stream stopped us: the server can stop too
                raise
            return download.array()
        return self._retrying(attempt, timeout, unary=False, safe=True)

    def delete(self, name: str, timeout: Optional[float] = None) -> TensorInfo:
        """Deletes the stored tensor `name`; returns what it was."""
        response = self._unary(self._stubs.delete_tensor, pb.DeleteTensorRequest(name=name),
                               timeout, safe=False)
        return TensorInfo.from_proto(response.info)

    def list(self, timeout: Optional[float] = None) -> List[TensorInfo]:
        """The stored tensors (this token's, when the server has tokens)."""
        response = self._unary(self._stubs.list_tensors, pb.ListTensorsRequest(), timeout)
        return [TensorInfo.from_proto(t) for t in response.tensors]

    def move(self, name: str, device: str, timeout: Optional[float] = None) -> MoveResult:
        """Moves the stored tensor `name` to `device` (a sharded one is gathered there): where it
        lives now (`info`), the bytes copied between devices (0: it was there already) and the
        server's time for it. Graphs that read it meanwhile see the old copy or the new one."""
        response = self._unary(self._stubs.move_tensor,
                               pb.MoveTensorRequest(name=name, device=device), timeout)
        return MoveResult.from_proto(response)

    def run(self, graph: Graph, raw_bfloat16: bool = False, shm: bool = False,
            timeout: Optional[float] = None) -> RunResult:
        """Executes the graph: its returned outputs as numpy arrays, and per node the algorithm
        that ran and its kernel time, bytes and GB/s. BFLOAT16 outputs as in get().
        shm: send the graph's inline tensors through a shared-memory region (the server on
        this host)."""
        request = graph.to_request()
        safe = _messages.stores_only_with_overwrite(request)
        if not shm:
            response = self._unary(self._stubs.execute, request, timeout, unary=False, safe=safe)
            return _messages.run_result(response, raw_bfloat16)
        nbytes, layout = _shm.pack_inline(request)
        with self._region(nbytes, timeout, "run") as region:
            _shm.move_inline(request, region, layout)
            response = self._unary(self._stubs.execute, request, timeout, unary=False, safe=safe)
        return _messages.run_result(response, raw_bfloat16)

    # ---- saved graphs: served by name, as models of the Open Inference Protocol ----
    def save_graph(self, name: str, graph: Graph, overwrite: bool = False,
                   timeout: Optional[float] = None) -> GraphInfo:
        """Keeps `graph` on the server under `name`, to run by name (run_saved) from any client
        of the Open Inference Protocol. Its inline tensors declared with g.input(name, dtype=,
        shape=) are the inputs (-1: any size); its returned outputs are the outputs. A graph
        that could never run is refused now (INVALID_ARGUMENT, as Execute would say)."""
        request = pb.SaveGraphRequest(name=name, graph=graph.to_request(), overwrite=overwrite)
        return GraphInfo.from_proto(
            self._unary(self._stubs.save_graph, request, timeout, safe=overwrite).info)

    def graphs(self, timeout: Optional[float] = None) -> List[GraphInfo]:
        """The saved graphs."""
        response = self._unary(self._stubs.list_graphs, pb.ListGraphsRequest(), timeout)
        return [GraphInfo.from_proto(g) for g in response.graphs]

    def delete_graph(self, name: str, timeout: Optional[float] = None) -> GraphInfo:
        """Deletes the saved graph `name`; returns what it was."""
        response = self._unary(self._stubs.delete_graph, pb.DeleteGraphRequest(name=name),
                               timeout, safe=False)
        return GraphInfo.from_proto(response.info)

    def run_saved(self, name: str, inputs: Mapping[str, Any], cast: bool = False,
                  raw_bfloat16: bool = False, shm: bool = False,
                  timeout: Optional[float] = None) -> SavedRunResult:
        """Runs the saved graph `name` on `inputs` (numpy arrays by input name): its outputs by
        node id, and the server's per-node figures (SavedRunResult.parameters).
        cast as for put; shm: send the inputs through a shared-memory region (the server on
        this host)."""
        request = _messages.infer_request(name, inputs, cast)
        if not shm:
            response = self._unary(self._stubs.model_infer, request, timeout, unary=False)
            return _messages.saved_run_result(response, raw_bfloat16)
        nbytes, layout = _shm.pack_infer_inputs(request)
        with self._region(nbytes, timeout, "run_saved") as region:
            _shm.move_infer_inputs(request, region, layout)
            response = self._unary(self._stubs.model_infer, request, timeout, unary=False)
        return _messages.saved_run_result(response, raw_bfloat16)

    # ---- streams: many requests in flight on one call ----
    def stream(self, graphs: Iterable[_stream.GraphItem], raw_bfloat16: bool = False,
               timeout: Optional[float] = None) -> Iterator[_stream.StreamResult]:
        """Runs many graphs over one ExecuteStream: several in flight at once, each answered as
        it completes. Yields a StreamResult per graph, in completion order: its id (give
        (id, graph) pairs, else a graph's position "0", "1", ...) and its RunResult, or the
        OpserveError that request failed with (result.value() raises it); a failed request does
        not end the stream. timeout: the deadline of the whole stream. Not retried."""
        deadline = self._config.deadline(timeout, unary=False)
        return _stream.run(_stream.execute_stream(self._channel), graphs, False, False,
                           raw_bfloat16, deadline.remaining(), self._config.metadata)

    def stream_saved(self, requests: Iterable[_stream.SavedItem], cast: bool = False,
                     raw_bfloat16: bool = False,
                     timeout: Optional[float] = None) -> Iterator[_stream.StreamResult]:
        """stream() for saved graphs and op models over one ModelStreamInfer: each request is
        (name, inputs) or (id, name, inputs), as run_saved takes them; each StreamResult holds
        a SavedRunResult or the error (its code is UNKNOWN: the protocol's stream carries the
        server's message alone)."""
        deadline = self._config.deadline(timeout, unary=False)
        return _stream.run(_stream.model_stream_infer(self._channel), requests, True, cast,
                           raw_bfloat16, deadline.remaining(), self._config.metadata)

    # ---- the calls' machinery ----
    def _get_shm(self, name: str, raw_bfloat16: bool, progress: Optional[_messages.Progress],
                 timeout: Optional[float]) -> np.ndarray:
        nbytes = _shm.tensor_size(self.list(timeout), name)
        with self._region(nbytes, timeout, "get") as region:
            request = pb.GetTensorRequest(name=name, shm=region.ref(0, max(nbytes, 1)))

            def attempt(remaining: Optional[float]) -> List[Any]:
                try:
                    return list(self._stubs.get_tensor(request, timeout=remaining,
                                                       metadata=self._config.metadata))
                except grpc.RpcError as e:
                    raise from_rpc_error(e) from None
            responses = self._retrying(attempt, timeout, unary=False, safe=True)
            array = _messages.shm_array(name, responses, region, raw_bfloat16)
        if progress:
            progress(array.nbytes, array.nbytes)
        return array

    @contextlib.contextmanager
    def _region(self, nbytes: int, timeout: Optional[float], call: str) -> Iterator[_shm.Region]:
        """A shared-memory region registered with the server for the body's duration."""
        _shm.check_local(self._config.target, call)
        region = _shm.Region(nbytes)
        try:
            self._unary(self._stubs.shm_register, region.register_request(), timeout, safe=False)
            failed = True
            try:
                yield region
                failed = False
            finally:
                try:
                    self._unary(self._stubs.shm_unregister, region.unregister_request(), timeout,
                                safe=False)
                except OpserveError:
                    if not failed:
                        raise  # the body's own error matters more than this one
        finally:
            region.close()

    def _unary(self, method: Any, request: Any, timeout: Optional[float], unary: bool = True,
               safe: bool = True) -> Any:
        """One request, one response (request: the message, or a function making it per try)."""
        def attempt(remaining: Optional[float]) -> Any:
            try:
                return method(request() if callable(request) else request, timeout=remaining,
                              metadata=self._config.metadata)
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
        return self._retrying(attempt, timeout, unary, safe)

    def _retrying(self, attempt: Callable[[Optional[float]], T], timeout: Optional[float],
                  unary: bool, safe: bool) -> T:
        """attempt(seconds left) until it succeeds, or fails in a way a retry cannot help."""
        deadline = self._config.deadline(timeout, unary)
        backoffs = self._config.backoffs(safe)
        while True:
            try:
                return attempt(deadline.remaining())
            except OpserveError as e:
                wait = retry_wait(e, backoffs, deadline, self._config.retry.codes)
                if wait is None:
                    raise
            time.sleep(wait)
