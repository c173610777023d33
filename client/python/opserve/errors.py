"""The one exception type the client raises for a request that failed."""

from __future__ import annotations

import grpc


class OpserveError(Exception):
    """A request failed: on the server, on the wire, or in the client's own checks of it.

    ``code`` is the ``grpc.StatusCode`` (the server's, e.g. NOT_FOUND for a missing tensor;
    INVALID_ARGUMENT for data the client refused before sending it) and ``message`` the server's
    message unchanged, so ``str(error)`` reads ``"NOT_FOUND: tensor 'A' not found"``.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def from_rpc_error(error: grpc.RpcError) -> OpserveError:
    """The OpserveError for a failed gRPC call (grpc.aio's AioRpcError included)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else None
    return OpserveError(code or grpc.StatusCode.UNKNOWN, details or str(error))


def invalid_argument(message: str) -> OpserveError:
    """An error found by the client before anything was sent, coded as the server would."""
    return OpserveError(grpc.StatusCode.INVALID_ARGUMENT, message)
