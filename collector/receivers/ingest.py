"""What both receivers do with an export request, whatever the protocol: authenticate, decode, store, answer.

The outcome is protocol-neutral; `otlp_grpc` and `otlp_http` turn it into status codes. Invalid spans are
counted and named in a partial success while the good spans of the same request are stored; a request
that cannot be decoded is rejected whole; backpressure and store failures are retryable.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import Enum

from tracejudge.collector.metrics import CollectorMetrics
from tracejudge.collector.receivers.decode_pool import DecodePool, DecoderUnavailable, Signal
from tracejudge.collector.store.span_store import Backpressure, SpanStore, StoreError
from tracejudge.mapping.otlp import OTLPDecodeError, UnsupportedContentTypeError

MAX_PROBLEMS_NAMED = 5
MAX_MESSAGE_CHARS = 2000


METRICS_DROPPED = "metrics_dropped"  # the answer label of metrics exports: accepted and dropped

class Answer(Enum):
    OK = "ok"
    UNAUTHENTICATED = "unauthenticated"
    INVALID = "invalid"
    UNSUPPORTED_TYPE = "unsupported_type"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Outcome:
    answer: Answer
    accepted: int = 0
    rejected: int = 0
    message: str = ""
    retry_after_s: int | None = None


def bearer_matches(authorization: str | None, token: bytes | None) -> bool:
    """`Bearer <token>` (scheme case-insensitive), compared in constant time; true when no token is set."""
    if token is None:
        return True
    scheme, _, supplied = (authorization or "").strip().partition(" ")
    # a header may hold any bytes (aiohttp hands non-ASCII ones over as surrogates): never an error, just no match
    return scheme.lower() == "bearer" and hmac.compare_digest(supplied.strip().encode("utf-8", "surrogateescape"),
                                                              token)


class Ingest:
    def __init__(self, store: SpanStore, metrics: CollectorMetrics, token: str | None, decoder: DecodePool,
                 max_inflight_bytes: int = 256 * 1024 * 1024) -> None:
        self.store = store
        self.decoder = decoder
        self.max_inflight_bytes = max_inflight_bytes  # requests being decoded: push back before spending CPU
        self._inflight_bytes = 0
        self.metrics = metrics
        self._token = token.encode() if token else None

    @contextlib.asynccontextmanager
    async def reading(self, size: int) -> AsyncIterator[None]:
        """Count a body being read against the in-flight bytes; Backpressure when it would not fit."""
        if size and self._inflight_bytes + size > self.max_inflight_bytes and self._inflight_bytes > 0:
            raise Backpressure(f"{self._inflight_bytes} bytes of requests are in flight; retry shortly",
                               self.store.retry_after_s)
        self._inflight_bytes += size
        try:
            yield
        finally:
            self._inflight_bytes -= size

    def authorized(self, authorization: str | None) -> bool:
        """Constant-time check of the `authorization` header or metadata; always true without a token."""
        return bearer_matches(authorization, self._token)

    async def export(self, payload: bytes, content_type: str, authorization: str | None, protocol: str,
                     signal: Signal = "traces") -> Outcome:
        """One export request of `signal` (traces, or logs carrying GenAI events) from a receiver."""
        outcome = await self._export(payload, content_type, authorization, signal)
        self.metrics.requests.labels(protocol, outcome.answer.value).inc()
        return outcome

    async def _export(self, payload: bytes, content_type: str, authorization: str | None,
                      signal: Signal) -> Outcome:
        if not self.authorized(authorization):
            return Outcome(Answer.UNAUTHENTICATED, message="missing or wrong bearer token")
        if self._inflight_bytes + len(payload) > self.max_inflight_bytes and self._inflight_bytes > 0:
            return Outcome(Answer.UNAVAILABLE, message=f"{self._inflight_bytes} bytes of requests are being "
                           "decoded; retry shortly", retry_after_s=self.store.retry_after_s)
        self._inflight_bytes += len(payload)
        try:
            return await self._store(payload, content_type, signal)
        finally:
            self._inflight_bytes -= len(payload)

    async def _store(self, payload: bytes, content_type: str, signal: Signal) -> Outcome:
        try:
            decoded = await self.decoder.decode(payload, content_type, signal)
        except UnsupportedContentTypeError as exc:
            return Outcome(Answer.UNSUPPORTED_TYPE, message=str(exc))
        except OTLPDecodeError as exc:
            return Outcome(Answer.INVALID, message=str(exc))
        except DecoderUnavailable as exc:
            return Outcome(Answer.UNAVAILABLE, message=str(exc), retry_after_s=self.store.retry_after_s)
        except Exception as exc:  # a decoder bug: a precise 400, never a 500 / UNKNOWN
            return Outcome(Answer.INVALID, message=f"the request could not be decoded ({type(exc).__name__}: "
                                                   f"{str(exc)[:200]})")
        received = decoded.spans + len(decoded.problems)
        self.metrics.spans_received.inc(received)
        try:
            accepted = await self.store.write(decoded.rows, decoded.digest)
        except Backpressure as exc:
            self.metrics.spans_rejected.labels("backpressure").inc(received)
            return Outcome(Answer.UNAVAILABLE, message=str(exc), retry_after_s=exc.retry_after_s)
        except StoreError as exc:
            self.metrics.spans_rejected.labels("store_error").inc(received)
            return Outcome(Answer.UNAVAILABLE, message=str(exc), retry_after_s=self.store.retry_after_s)
        cut = (f"{decoded.truncated} span(s) stored with attributes, events, links or values cut to the span "
               "limits ([limits] in tracejudge.toml, OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT ...)") if decoded.truncated else ""
        if not decoded.problems:
            return Outcome(Answer.OK, accepted=accepted, message=cut)
        self.metrics.spans_rejected.labels("invalid_span").inc(len(decoded.problems))
        named = "; ".join(str(p) for p in decoded.problems[:MAX_PROBLEMS_NAMED])
        more = len(decoded.problems) - MAX_PROBLEMS_NAMED
        what = "span(s)" if signal == "traces" else "log record(s)"
        message = f"{len(decoded.problems)} invalid {what} rejected: {named}" + (f"; and {more} more" if more > 0
                                                                                  else "")
        message = f"{message}; {cut}" if cut else message
        return Outcome(Answer.OK, accepted=accepted, rejected=len(decoded.problems),
                       message=message[:MAX_MESSAGE_CHARS])
