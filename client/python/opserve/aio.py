"""The asyncio client, on grpc.aio: the same calls as opserve.Client, as coroutines.

    async with opserve.aio.Client("127.0.0.1:50051") as client:
        await client.put("A", a)
        result = await client.run(graph)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import (Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, List,
                    Mapping, Optional, Sequence, Tuple, TypeVar, Union)

import grpc
import grpc.aio
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
    """opserve.Client's asyncio twin: same arguments, same results, same OpserveError, the same
    default deadline, retries and sessions.

    Create it inside the event loop that will use it (grpc.aio channels belong to one loop).
    """

    def __init__(self, target: str = "127.0.0.1:50051", token: Optional[str] = None,
                 tls: Union[bool, TLS] = False, session: Union[None, bool, str] = None,
                 timeout: Optional[float] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 unary_timeout: Optional[float] = 30.0, retry: Union[bool, Retry] = True) -> None:
        self._config = ClientConfig(target, token, tls, session, timeout, unary_timeout, retry,
                                    chunk_bytes, channel_options)
        self.session = self._config.session
        self._channel = self._config.channel(grpc.aio)
        self._stubs = Stubs(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def health(self, timeout: Optional[float] = None) -> bool:
        """True when the server is SERVING (grpc.health.v1)."""
        response = await self._unary(self._stubs.health_check, pb.HealthCheckRequest(), timeout)
        return _messages.serving(response)

    async def ops(self, timeout: Optional[float] = None) -> OpsInfo:
        """As opserve.Client.ops."""
        return OpsInfo.from_proto(await self._unary(self._stubs.list_ops, pb.ListOpsRequest(),
                                                    timeout))

    async def devices(self, timeout: Optional[float] = None) -> Tuple[DeviceInfo, ...]:
        """As opserve.Client.devices."""
        return (await self.ops(timeout)).devices

    async def put(self, name: str, array: Any, overwrite: bool = False,
                  dtype: Optional[DTypeLike] = None, cast: bool = False, shm: bool = False,
                  progress: Optional[_messages.Progress] = None,
                  timeout: Optional[float] = None, device: Optional[str] = None,
                  shard: bool = False) -> TensorInfo:
        """As opserve.Client.put."""
        placement = _messages.Placement(name, device, shard)
        dt, shape, wire = encode(_cast.prepare(array, dtype, cast, f"put {name!r}"), dtype)
        if shm:
            async with self._region(wire.nbytes, timeout, "put") as region:
                region.write(0, wire.reshape(-1).view(np.uint8))
                request = _messages.put_header(name, dt, shape, overwrite, placement,
                                               region.ref(0, wire.nbytes))
                response = await self._unary(self._stubs.put_tensor, lambda: iter((request,)),
                                             timeout, unary=False, safe=overwrite)
            if progress:
                progress(wire.nbytes, wire.nbytes)
            return TensorInfo.from_proto(response.info, response.seconds)

        async def attempt(remaining: Optional[float]) -> TensorInfo:
            upload = _messages.Upload(name, dt, shape, wire, overwrite, placement,
                                      self._config.chunk_bytes, progress)
            try:
                response = await self._stubs.put_tensor(upload.requests(), timeout=remaining,
                                                        metadata=self._config.metadata)
            except grpc.RpcError as e:
                if upload.error is not None:
                    raise upload.error from None
                raise from_rpc_error(e) from None
            return TensorInfo.from_proto(response.info, response.seconds)
        return await self._retrying(attempt, timeout, unary=False, safe=overwrite)

    async def get(self, name: str, raw_bfloat16: bool = False, shm: bool = False,
                  progress: Optional[_messages.Progress] = None,
                  timeout: Optional[float] = None) -> np.ndarray:
        """As opserve.Client.get."""
        if shm:
            return await self._get_shm(name, raw_bfloat16, progress, timeout)

        async def attempt(remaining: Optional[float]) -> np.ndarray:
            download = _messages.Download(name, raw_bfloat16, progress)
            request = pb.GetTensorRequest(name=name, chunk_bytes=self._config.chunk_bytes)
            call = self._stubs.get_tensor(request, timeout=remaining,
                                          metadata=self._config.metadata)
            try:
                async for response in call:
                    download.add(response)
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
            except BaseException:
                call.cancel()  # progress or a malformed stream stopped us: the server can stop too
                raise
            return download.array()
        return await self._retrying(attempt, timeout, unary=False, safe=True)

    async def delete(self, name: str, timeout: Optional[float] = None) -> TensorInfo:
        """As opserve.Client.delete."""
        response = await self._unary(self._stubs.delete_tensor, pb.DeleteTensorRequest(name=name),
                                     timeout, safe=False)
        return TensorInfo.from_proto(response.info)

    async def list(self, timeout: Optional[float] = None) -> List[TensorInfo]:
        """As opserve.Client.list."""
        response = await self._unary(self._stubs.list_tensors, pb.ListTensorsRequest(), timeout)
        return [TensorInfo.from_proto(t) for t in response.tensors]

    async def move(self, name: str, device: str, timeout: Optional[float] = None) -> MoveResult:
        """As opserve.Client.move."""
        response = await self._unary(self._stubs.move_tensor,
                                     pb.MoveTensorRequest(name=name, device=device), timeout)
        return MoveResult.from_proto(response)

    async def run(self, graph: Graph, raw_bfloat16: bool = False, shm: bool = False,
                  timeout: Optional[float] = None) -> RunResult:
        """As opserve.Client.run."""
        request = graph.to_request()
        safe = _messages.stores_only_with_overwrite(request)
        if not shm:
            response = await self._unary(self._stubs.execute, request, timeout, unary=False,
                                         safe=safe)
            return _messages.run_result(response, raw_bfloat16)
        nbytes, layout = _shm.pack_inline(request)
        async with self._region(nbytes, timeout, "run") as region:
            _shm.move_inline(request, region, layout)
            response = await self._unary(self._stubs.execute, request, timeout, unary=False,
                                         safe=safe)
        return _messages.run_result(response, raw_bfloat16)

    async def save_graph(self, name: str, graph: Graph, overwrite: bool = False,
                         timeout: Optional[float] = None) -> GraphInfo:
        """As opserve.Client.save_graph."""
        request = pb.SaveGraphRequest(name=name, graph=graph.to_request(), overwrite=overwrite)
        response = await self._unary(self._stubs.save_graph, request, timeout, safe=overwrite)
        return GraphInfo.from_proto(response.info)

    async def graphs(self, timeout: Optional[float] = None) -> List[GraphInfo]:
        """As opserve.Client.graphs."""
        response = await self._unary(self._stubs.list_graphs, pb.ListGraphsRequest(), timeout)
        return [GraphInfo.from_proto(g) for g in response.graphs]

    async def delete_graph(self, name: str, timeout: Optional[float] = None) -> GraphInfo:
        """As opserve.Client.delete_graph."""
        response = await self._unary(self._stubs.delete_graph, pb.DeleteGraphRequest(name=name),
                                     timeout, safe=False)
        return GraphInfo.from_proto(response.info)

    async def run_saved(self, name: str, inputs: Mapping[str, Any], cast: bool = False,
                        raw_bfloat16: bool = False, shm: bool = False,
                        timeout: Optional[float] = None) -> SavedRunResult:
        """As opserve.Client.run_saved."""
        request = _messages.infer_request(name, inputs, cast)
        if not shm:
            response = await self._unary(self._stubs.model_infer, request, timeout, unary=False)
            return _messages.saved_run_result(response, raw_bfloat16)
        nbytes, layout = _shm.pack_infer_inputs(request)
        async with self._region(nbytes, timeout, "run_saved") as region:
            _shm.move_infer_inputs(request, region, layout)
            response = await self._unary(self._stubs.model_infer, request, timeout, unary=False)
        return _messages.saved_run_result(response, raw_bfloat16)

    # ---- streams: many requests in flight on one call ----
    def stream(self, graphs: Union[Iterable[_stream.GraphItem], AsyncIterable[_stream.GraphItem]],
               raw_bfloat16: bool = False,
               timeout: Optional[float] = None) -> AsyncIterator[_stream.StreamResult]:
        """As opserve.Client.stream, iterated with `async for`; graphs may be an async iterable."""
        deadline = self._config.deadline(timeout, unary=False)
        return _stream.run_async(_stream.execute_stream(self._channel), graphs, False, False,
                                 raw_bfloat16, deadline.remaining(), self._config.metadata)

    def stream_saved(self, requests: Union[Iterable[_stream.SavedItem],
                                           AsyncIterable[_stream.SavedItem]],
                     cast: bool = False, raw_bfloat16: bool = False,
                     timeout: Optional[float] = None) -> AsyncIterator[_stream.StreamResult]:
        """As opserve.Client.stream_saved, iterated with `async for`."""
        deadline = self._config.deadline(timeout, unary=False)
        return _stream.run_async(_stream.model_stream_infer(self._channel), requests, True, cast,
                                 raw_bfloat16, deadline.remaining(), self._config.metadata)

    # ---- the calls' machinery, as opserve.Client's ----
    async def _get_shm(self, name: str, raw_bfloat16: bool,
                       progress: Optional[_messages.Progress],
                       timeout: Optional[float]) -> np.ndarray:
        nbytes = _shm.tensor_size(await self.list(timeout), name)
        async with self._region(nbytes, timeout, "get") as region:
            request = pb.GetTensorRequest(name=name, shm=region.ref(0, max(nbytes, 1)))

            async def attempt(remaining: Optional[float]) -> List[Any]:
                try:
                    return [r async for r in self._stubs.get_tensor(
                        request, timeout=remaining, metadata=self._config.metadata)]
                except grpc.RpcError as e:
                    raise from_rpc_error(e) from None
            responses = await self._retrying(attempt, timeout, unary=False, safe=True)
            array = _messages.shm_array(name, responses, region, raw_bfloat16)
        if progress:
            progress(array.nbytes, array.nbytes)
        return array

    @contextlib.asynccontextmanager
    async def _region(self, nbytes: int, timeout: Optional[float],
                      call: str) -> AsyncIterator[_shm.Region]:
        _shm.check_local(self._config.target, call)
        region = _shm.Region(nbytes)
        try:
            await self._unary(self._stubs.shm_register, region.register_request(), timeout,
                              safe=False)
            failed = True
            try:
                yield region
                failed = False
            finally:
                try:
                    await self._unary(self._stubs.shm_unregister, region.unregister_request(),
                                      timeout, safe=False)
                except OpserveError:
                    if not failed:
                        raise  # the body's own error matters more than this one
        finally:
            region.close()

    async def _unary(self, method: Any, request: Any, timeout: Optional[float],
                     unary: bool = True, safe: bool = True) -> Any:
        """One request, one response (request: the message, or a function making it per try)."""
        async def attempt(remaining: Optional[float]) -> Any:
            try:
                return await method(request() if callable(request) else request,
                                    timeout=remaining, metadata=self._config.metadata)
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
        return await self._retrying(attempt, timeout, unary, safe)

    async def _retrying(self, attempt: Callable[[Optional[float]], Awaitable[T]],
                        timeout: Optional[float], unary: bool, safe: bool) -> T:
        """attempt(seconds left) until it succeeds, or fails in a way a retry cannot help."""
        deadline = self._config.deadline(timeout, unary)
        backoffs = self._config.backoffs(safe)
        while True:
            try:
                return await attempt(deadline.remaining())
            except OpserveError as e:
                wait = retry_wait(e, backoffs, deadline, self._config.retry.codes)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
