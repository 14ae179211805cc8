"""When to retry a judge call and how long to wait: exponential backoff with jitter, or the server's word.

A server's `retry-after-ms` / `Retry-After` (seconds or an HTTP date) wins over the computed backoff,
capped by `max_delay_s` so a bad header cannot stall a run for hours.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TypeVar


def retryable_status(status: int) -> bool:
    """Timeouts, conflicts, rate limits and every 5xx (529 Overloaded and proxies' 52x included)."""
    return status in (408, 409, 429) or 500 <= status <= 599


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, from `retry-after-ms` or `Retry-After`; None if absent."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff schedule of one judge. `sleep` is replaceable so callers can run their own clock."""

    max_retries: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    jitter: float = 0.5
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False, repr=False)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Wait before retry number `attempt` (0-based): the server's delay, else backoff with jitter."""
        if retry_after is not None:
            return min(retry_after, self.max_delay_s)
        backoff = min(self.base_delay_s * (2**attempt), self.max_delay_s)
        return backoff * (1.0 - self.jitter * random.random())


@dataclass(frozen=True)
class Retry:
    """A failure worth retrying: what went wrong, and how long the server asked us to wait (if it did)."""

    what: str
    after: float | None = None


T = TypeVar("T")


async def call_with_retries(
    policy: RetryPolicy,
    send: Callable[[], Awaitable[T]],
    classify: Callable[[Exception], Retry | None],
    exhausted: Callable[[str, int], Exception],
) -> T:
    """`send()` until it succeeds; `classify` says which failures to retry (it may raise its own error).

    After `policy.max_retries` retries the error from `exhausted(last failure, attempts)` is raised.
    """
    failures = 0
    while True:
        try:
            return await send()
        except Exception as exc:
            retry = classify(exc)
            if retry is None:
                raise
            if failures >= policy.max_retries:
                raise exhausted(retry.what, failures + 1) from exc
        await policy.sleep(policy.delay(failures, retry.after))
        failures += 1
