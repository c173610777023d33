"""The one exception type the client raises for a request that failed."""

from __future__ import annotations

from typing import Optional

import grpc

# Trailing metadata of a NOT_FOUND from a replica that never stored anything for the session.
SESSION_UNKNOWN_TRAILER = "x-opserve-session-unknown"


class OpserveError(Exception):
    """A request failed: on the server, on the wire, or in the client's own checks of it.

    ``code`` is the ``grpc.StatusCode`` (the server's, e.g. NOT_FOUND for a missing tensor;
    INVALID_ARGUMENT for data the client refused before sending it) and ``message`` the server's
    message unchanged, so ``str(error)`` reads ``"NOT_FOUND: tensor 'A' not found"``.

    ``session_unknown`` is set on a NOT_FOUND for a stored tensor when the replica that answered
    never stored anything for this client's session (its name, from the trailing metadata
    ``x-opserve-session-unknown``): behind a proxy, the session's replica went away and its
    tensors with it. Put them again. None otherwise.
    """

    def __init__(self, code: grpc.StatusCode, message: str,
                 session_unknown: Optional[str] = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.session_unknown = session_unknown


def from_rpc_error(error: grpc.RpcError) -> OpserveError:
    """The OpserveError for a failed gRPC call (grpc.aio's AioRpcError included)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else None
    trailers = error.trailing_metadata() if callable(getattr(error, "trailing_metadata", None)) else None
    lost = next((v for k, v in trailers or () if k == SESSION_UNKNOWN_TRAILER), None)
    return OpserveError(code or grpc.StatusCode.UNKNOWN, details or str(error), lost)


def invalid_argument(message: str) -> OpserveError:
    """An error found by the client before anything was sent, coded as the server would."""
    return OpserveError(grpc.StatusCode.INVALID_ARGUMENT, message)
