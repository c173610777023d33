"""Many requests over one stream (ExecuteStream, ModelStreamInfer), for the sync and asyncio
clients alike.

The server runs several of a stream's requests at once (at most its --stream_window) and answers
them as they complete, each with its request's id: results come back in completion order, not
in the order sent. A request that fails is answered with its error (StreamResult.error) and the
stream goes on; only a failure of the stream itself (a wrong token, a cancelled call, a server
going away) raises OpserveError from the iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import (Any, AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Optional,
                    Tuple, Union)

import grpc

from opserve import _messages
from opserve._proto import pb
from opserve.errors import OpserveError, from_rpc_error
from opserve.graph import Graph
from opserve.types import RunResult, SavedRunResult

_EXECUTE_STREAM = "/opserve.v1.OpServe/ExecuteStream"
_MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
_CODES = {c.value[0]: c for c in grpc.StatusCode}

# What stream() takes: a Graph (its id is its position, "0", "1", ...) or (id, Graph).
GraphItem = Union[Graph, Tuple[str, Graph]]
# What stream_saved() takes: (name, inputs) (id: its position) or (id, name, inputs).
SavedItem = Union[Tuple[str, Mapping[str, Any]], Tuple[str, str, Mapping[str, Any]]]


@dataclass(frozen=True)
class StreamResult:
    """One request's answer on a stream: its id and either its result or its error."""

    id: str
    result: Union[RunResult, SavedRunResult, None] = None
    error: Optional[OpserveError] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def value(self) -> Union[RunResult, SavedRunResult]:
        """The result, or the request's error raised."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def execute_stream(channel: Any) -> Any:
    """ExecuteStream's multicallable on a grpc or grpc.aio channel."""
    return channel.stream_stream(_EXECUTE_STREAM,
                                 request_serializer=pb.ExecuteStreamRequest.SerializeToString,
                                 response_deserializer=pb.ExecuteStreamResponse.FromString)


def model_stream_infer(channel: Any) -> Any:
    """ModelStreamInfer's multicallable on a grpc or grpc.aio channel."""
    return channel.stream_stream(_MODEL_STREAM_INFER,
                                 request_serializer=pb.ModelInferRequest.SerializeToString,
                                 response_deserializer=pb.ModelStreamInferResponse.FromString)


class Requests:
    """The stream's requests, made one by one as gRPC sends them (so a long or endless iterable
    is never held at once). gRPC turns an exception raised while it iterates them into a bare
    CANCELLED or UNKNOWN status, so the first one is kept in `error`, to raise in its place."""

    def __init__(self, items: Iterable[Any], saved: bool, cast: bool) -> None:
        self._items = items
        self._saved = saved
        self._cast = cast
        self.error: Optional[BaseException] = None

    def __iter__(self) -> Iterator[Any]:
        try:
            for i, item in enumerate(self._items):
                yield self.request(i, item)
        except BaseException as e:
            self.error = e
            raise

    async def aiter(self) -> AsyncIterator[Any]:
        """The same, from an async iterable of items."""
        try:
            i = 0
            async for item in self._items:  # type: ignore[attr-defined]
                yield self.request(i, item)
                i += 1
        except BaseException as e:
            self.error = e
            raise

    def request(self, i: int, item: Any) -> Any:
        if self._saved:
            id_, name, inputs = item if len(item) == 3 else (str(i), *item)
            r = _messages.infer_request(name, inputs, self._cast)
            r.id = str(id_)
            return r
        id_, graph = item if isinstance(item, tuple) else (str(i), item)
        if not isinstance(graph, Graph):
            raise TypeError(f"stream item {id_!r}: expected a Graph, got {type(graph).__name__}")
        return pb.ExecuteStreamRequest(id=str(id_), request=graph.to_request())


def result(response: Any, saved: bool, raw_bfloat16: bool) -> StreamResult:
    """A stream response as the StreamResult of its request."""
    if saved:
        r = response.infer_response
        if response.error_message:
            return StreamResult(r.id, error=OpserveError(grpc.StatusCode.UNKNOWN,
                                                         response.error_message))
        return StreamResult(r.id, result=_messages.saved_run_result(r, raw_bfloat16))
    if response.WhichOneof("result") == "status":
        code = _CODES.get(response.status.code, grpc.StatusCode.UNKNOWN)
        return StreamResult(response.id, error=OpserveError(code, response.status.message))
    return StreamResult(response.id, result=_messages.run_result(response.response, raw_bfloat16))


def failure(requests: "Requests", error: grpc.RpcError) -> Exception:
    """What a broken stream raises: the caller's own item that could not be sent, which is why
    gRPC cancelled the call, else the call's error."""
    return requests.error if requests.error is not None else from_rpc_error(error)


def run(method: Any, items: Iterable[Any], saved: bool, cast: bool, raw_bfloat16: bool,
        timeout: Optional[float], metadata: Any) -> Iterator[StreamResult]:
    """The sync clients' stream: the call starts at the first next(); a consumer that stops
    early (or is closed) cancels it."""
    requests = Requests(items, saved, cast)
    call = method(iter(requests), timeout=timeout, metadata=metadata)
    try:
        for response in call:
            yield result(response, saved, raw_bfloat16)
    except grpc.RpcError as e:
        raise failure(requests, e) from None
    finally:
        call.cancel()  # nothing once the call ended
    if requests.error is not None:
        raise requests.error


async def run_async(method: Any, items: Union[Iterable[Any], AsyncIterable[Any]], saved: bool,
                    cast: bool, raw_bfloat16: bool, timeout: Optional[float],
                    metadata: Any) -> AsyncIterator[StreamResult]:
    """run() for grpc.aio: items may be an async iterable too."""
    requests = Requests(items, saved, cast)
    call = method(requests.aiter() if hasattr(items, "__aiter__") else iter(requests),
                  timeout=timeout, metadata=metadata)
    try:
        async for response in call:
            yield result(response, saved, raw_bfloat16)
    except grpc.RpcError as e:
        raise failure(requests, e) from None
    finally:
        call.cancel()
    if requests.error is not None:
        raise requests.error
