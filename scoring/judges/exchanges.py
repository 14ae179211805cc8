"""What a judge was sent and what it answered, kept per measure when the caller asks: the collector stores them
(`judge_calls`) so a user can check a score against the judge's own exchange.

Recording is off unless a caller opens `recording()`: the judges call `record`, which finds the log through a
context variable (it follows the measure into the tasks it starts), so no metric or judge signature changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 16_000  # characters kept of each message and of each answer
MAX_EXCHANGES = 50  # per measure; past it they are counted, not kept


@dataclass(frozen=True)
class JudgeExchange:
    """One request as sent (after prompt reduction: model, messages, parameters) and its raw answer or error."""

    judge: str
    request: dict[str, Any]
    response: str | None
    error: str | None
    input_tokens: int
    output_tokens: int
    latency_ms: float
    started_at: float  # Unix time


@dataclass
class ExchangeLog:
    exchanges: list[JudgeExchange] = field(default_factory=list)
    dropped: int = 0

    def add(self, exchange: JudgeExchange) -> None:
        if len(self.exchanges) < MAX_EXCHANGES:
            self.exchanges.append(exchange)
        else:
            self.dropped += 1


_CURRENT: ContextVar[ExchangeLog | None] = ContextVar("tracejudge_judge_exchanges", default=None)


@contextmanager
def recording() -> Iterator[ExchangeLog]:
    """Keep the exchanges of every judge call made inside (and in the tasks it starts)."""
    log = ExchangeLog()
    token = _CURRENT.set(log)
    try:
        yield log
    finally:
        _CURRENT.reset(token)


def is_recording() -> bool:
    return _CURRENT.get() is not None


def record(judge: str, request: dict[str, Any], response: str | None, error: str | None, started: float,
           input_tokens: int = 0, output_tokens: int = 0) -> None:
    """Add an exchange to the open log, if any; `started` is `time.time()` before the request went out."""
    log = _CURRENT.get()
    if log is None:
        return
    log.add(JudgeExchange(judge, _bounded(request), _cut(response), _cut(error), input_tokens, output_tokens,
                          (time.time() - started) * 1000, started))


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT:
        return text
    return f"{text[:MAX_TEXT]}… [{len(text) - MAX_TEXT} more characters not kept]"


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, dict):
        return {str(k): _bounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value]
    if value is None or isinstance(value, int | float | bool):
        return value
    return _cut(str(value))
