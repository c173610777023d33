"""When a failed call is tried again, and how long the client waits before each new attempt."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import grpc

# A busy server (its device queue full, --max_inflight) answers RESOURCE_EXHAUSTED before doing
# any of the work; UNAVAILABLE is a connection that failed or a server that is restarting.
# Both pass with time, every other code would fail again the same way.
RETRIABLE_CODES = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


@dataclass(frozen=True)
class Retry:
    """Bounded retry with exponential backoff and full jitter, for calls that are safe to repeat.

    attempts: the most tries of one call, the first included (1: no retry).
    initial_backoff / max_backoff: the wait before the second try, and the most any wait may be,
        in seconds; each wait is drawn uniformly from [0, min(max_backoff, initial_backoff *
        multiplier ** (try - 1))], so that clients refused together do not come back together.
    codes: the grpc.StatusCode values that are retried.

    Retried: calls that change nothing (health, ops, list, get, graphs) or change the same thing
    twice alike (run of a graph that stores nothing or overwrites what it stores, put and
    save_graph with overwrite=True, run_saved). Other calls fail on their first error. A call's
    deadline covers all of its tries.
    """

    attempts: int = 6
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    codes: Tuple[grpc.StatusCode, ...] = RETRIABLE_CODES

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Retry.attempts must be at least 1, got {self.attempts}")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("Retry: backoffs must be >= 0 and the multiplier >= 1, got "
                             f"{self.initial_backoff}, {self.max_backoff}, {self.multiplier}")

    def backoffs(self) -> Iterator[float]:
        """The wait before each try after the first: attempts - 1 of them."""
        for i in range(self.attempts - 1):
            ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** i)
            yield random.uniform(0, ceiling)


NO_RETRY = Retry(attempts=1)


def policy_of(retry: "bool | Retry | None") -> Retry:
    """A client's retry= argument as a policy: True (the default policy), False/None, or one."""
    if isinstance(retry, Retry):
        return retry
    if retry is True:
        return Retry()
    if retry is False or retry is None:
        return NO_RETRY
    raise TypeError(f"retry must be True, False or an opserve.Retry, got {type(retry).__name__}")


class Deadline:
    """One call's deadline over all its tries: the time each try may take, and whether a wait
    still leaves time for another try."""

    def __init__(self, timeout: Optional[float]) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def allows_wait(self, seconds: float) -> bool:
        return self._end is None or time.monotonic() + seconds < self._end
