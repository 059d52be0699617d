"""Retry policy: capped exponential back-off with full jitter, Retry-After, and a shared retry budget."""

from __future__ import annotations

import email.utils
import threading
from dataclasses import dataclass
from typing import Callable

__all__ = [
    "RetryPolicy",
    "RetryBudget",
    "DEFAULT_BUDGET",
    "backoff_delay",
    "parse_retry_after",
]

# The longest Retry-After honoured, in seconds; a larger value is read as this. A server that asks for
# more than the caller's deadline leaves makes the client stop (it never waits past its deadline).
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """How one operation retries.

    max_attempts:    requests sent at most for one operation (the first included); >= 1.
    initial_backoff: seconds; the cap of the first back-off.
    max_backoff:     seconds; no back-off cap grows beyond this.
    deadline:        seconds since the first attempt after which no retry starts and no back-off sleeps
                     past; each attempt's timeout is also cut to what is left.
    """

    max_attempts: int = 10
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    deadline: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("back-off must be >= 0")
        if self.deadline <= 0:
            raise ValueError("deadline must be > 0")


def backoff_delay(
    policy: RetryPolicy, retry: int, random: Callable[[], float], retry_after: float | None = None
) -> float:
    """The sleep before retry number ``retry`` (0 for the first retry), in seconds.

    Full jitter: uniform in [0, min(max_backoff, initial_backoff * 2**retry)], drawn from ``random``
    (a float in [0, 1)), and never less than ``retry_after`` when the server sent one.
    """
    cap = min(policy.max_backoff, policy.initial_backoff * (2.0 ** min(max(retry, 0), 30)))
    r = random()
    if not 0.0 <= r < 1.0:  # an injected source that misbehaves must not make waits negative
        r = 0.0 if r != r else min(max(r, 0.0), 1.0)
    delay = cap * r
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


def parse_retry_after(value: str | None, now_unix: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP date. None if absent or
    malformed (it is then ignored). Dates in the past give 0; values are capped at an hour."""
    if value is None:
        return None
    v = value.strip()
    if not v:
        return None
    if v.isascii() and v.isdigit():
        if len(v) > 10:
            return MAX_RETRY_AFTER_S
        return min(float(int(v)), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate gives naive for "-0000"
        return None
    try:
        return min(max(when.timestamp() - now_unix, 0.0), MAX_RETRY_AFTER_S)
    except (OverflowError, ValueError, OSError):
        return None


class RetryBudget:
    """A token bucket that caps retries across every operation that shares it, so an outage does not
    turn into a retry storm.

    Each retry takes ``retry_cost`` tokens; when fewer are left the retry is refused and the operation
    ends with its last error. Each operation that ends with a final answer from the server (success, or
    a 4xx that is not retried) gives back ``refill_per_success`` tokens, up to ``capacity``. First
    attempts never need a token, so a recovered service refills the bucket by being used.

    Defaults: capacity 50, retry_cost 1, refill_per_success 0.1 -- after a burst of 50 retries, at most
    one retry per ten successful operations until the bucket fills again.

    Thread-safe: one instance is meant to be shared (``DEFAULT_BUDGET`` is the process-wide one).
    """

    def __init__(
        self, capacity: float = 50.0, retry_cost: float = 1.0, refill_per_success: float = 0.1
    ) -> None:
        if capacity < 0 or retry_cost <= 0 or refill_per_success < 0:
            raise ValueError("capacity and refill must be >= 0, retry_cost > 0")
        self._capacity = float(capacity)
        self._cost = float(retry_cost)
        self._refill = float(refill_per_success)
        self._tokens = float(capacity)
        self._lock = threading.Lock()

    @property
    def capacity(self) -> float:
        return self._capacity

    @property
    def tokens(self) -> float:
        with self._lock:
            return self._tokens

    def try_acquire(self) -> bool:
        """Takes one retry's tokens and returns True, or returns False (and takes nothing) if too few
        are left."""
        with self._lock:
            if self._tokens + 1e-9 < self._cost:
                return False
            self._tokens = max(self._tokens - self._cost, 0.0)
            return True

    def record_success(self) -> None:
        """Gives back ``refill_per_success`` tokens, never beyond ``capacity``."""
        with self._lock:
            self._tokens = min(self._tokens + self._refill, self._capacity)


DEFAULT_BUDGET = RetryBudget()
"""The process-wide budget every Client uses unless given another."""
