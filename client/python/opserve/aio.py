"""The asyncio client, on grpc.aio: the same calls as opserve.Client, as coroutines.

    async with opserve.aio.Client("127.0.0.1:50051") as client:
        await client.put("A", a)
        result = await client.run(graph)
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio
import numpy as np

from opserve import _messages
from opserve._channel import DEFAULT_CHUNK_BYTES, TLS, ClientConfig, Stubs
from opserve._proto import pb
from opserve.dtypes import DTypeLike, encode
from opserve.errors import OpserveError, from_rpc_error
from opserve.graph import Graph
from opserve.types import OpsInfo, RunResult, TensorInfo


class Client:
    """opserve.Client's asyncio twin: same arguments, same results, same OpserveError.

    Create it inside the event loop that will use it (grpc.aio channels belong to one loop).
    """

    def __init__(self, target: str = "127.0.0.1:50051", token: Optional[str] = None,
                 tls: Union[bool, TLS] = False, session: Optional[str] = None,
                 timeout: Optional[float] = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 channel_options: Sequence[Tuple[str, Any]] = ()) -> None:
        self._config = ClientConfig(target, token, tls, session, timeout, chunk_bytes,
                                    channel_options)
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
        response = await self._call(self._stubs.health_check, pb.HealthCheckRequest(), timeout)
        return _messages.serving(response)

    async def ops(self, timeout: Optional[float] = None) -> OpsInfo:
        return OpsInfo.from_proto(await self._call(self._stubs.list_ops, pb.ListOpsRequest(), timeout))

    async def put(self, name: str, array: Any, overwrite: bool = False,
                  dtype: Optional[DTypeLike] = None, progress: Optional[_messages.Progress] = None,
                  timeout: Optional[float] = None) -> TensorInfo:
        """As opserve.Client.put."""
        dt, shape, wire = encode(array, dtype)
        upload = _messages.Upload(name, dt, shape, wire, overwrite, self._config.chunk_bytes,
                                  progress)
        try:
            response = await self._call(self._stubs.put_tensor, upload.requests(), timeout)
        except OpserveError:
            if upload.error is not None:
                raise upload.error from None
            raise
        return TensorInfo.from_proto(response.info)

    async def get(self, name: str, raw_bfloat16: bool = False,
                  progress: Optional[_messages.Progress] = None,
                  timeout: Optional[float] = None) -> np.ndarray:
        """As opserve.Client.get."""
        download = _messages.Download(name, raw_bfloat16, progress)
        request = pb.GetTensorRequest(name=name, chunk_bytes=self._config.chunk_bytes)
        call = self._stubs.get_tensor(request, **self._config.call_args(timeout))
        try:
            async for response in call:
                download.add(response)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()  # progress or a malformed stream stopped us: the server can stop too
            raise
        return download.array()

    async def delete(self, name: str, timeout: Optional[float] = None) -> TensorInfo:
        response = await self._call(self._stubs.delete_tensor, pb.DeleteTensorRequest(name=name),
                                    timeout)
        return TensorInfo.from_proto(response.info)

    async def list(self, timeout: Optional[float] = None) -> List[TensorInfo]:
        response = await self._call(self._stubs.list_tensors, pb.ListTensorsRequest(), timeout)
        return [TensorInfo.from_proto(t) for t in response.tensors]

    async def run(self, graph: Graph, raw_bfloat16: bool = False,
                  timeout: Optional[float] = None) -> RunResult:
        """As opserve.Client.run."""
        response = await self._call(self._stubs.execute, graph.to_request(), timeout)
        return _messages.run_result(response, raw_bfloat16)

    async def _call(self, method: Any, request: Any, timeout: Optional[float]) -> Any:
        try:
            return await method(request, **self._config.call_args(timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

