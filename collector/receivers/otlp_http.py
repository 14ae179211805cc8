"""OTLP/HTTP receiver: `POST /v1/traces` (and `/v1/logs`, for GenAI events sent as log records) with protobuf or
JSON bodies, gzip or deflate encoded. `POST /v1/metrics` is read (within the same limits), answered OK and
dropped: SDKs set up to export every signal (logfire's default) get no 404 to log.

Answers follow the OTLP/HTTP spec: 200 with an ExportTraceServiceResponse (partial success included) in
the request's content type; 400 with a google.rpc.Status for an undecodable body; 401 without the right
bearer token; 413 over the size limit (measured after decompression); 415 for another content type;
503 with Retry-After under backpressure or while the store cannot write.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import zlib
from pathlib import Path

from aiohttp import web
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from tracejudge.collector.config import ServerSettings
from tracejudge.collector.receivers.decode_pool import Signal
from tracejudge.collector.receivers.http_guard import GuardedSite, body_deadline_s
from tracejudge.collector.receivers.ingest import METRICS_DROPPED, Answer, Ingest, Outcome
from tracejudge.collector.store.span_store import Backpressure

TRACES_PATH = "/v1/traces"
LOGS_PATH = "/v1/logs"
METRICS_PATH = "/v1/metrics"

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class TooLarge(Exception):
    pass


MAX_GZIP_MEMBERS = 10_000  # an exporter sends one; thousands of empty members are an attack
_CHUNK = 64 * 1024


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The body without its Content-Encoding, refusing to grow past `limit` bytes (zip bombs included).

    Linear in the body: input is fed in chunks, so a body of many gzip members never copies the rest of the
    body once per member, and the member count is capped as it goes.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise TooLarge
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
    if wbits is None:
        raise ValueError(f"unsupported Content-Encoding {encoding!r}: send gzip, deflate or none")
    out = bytearray()
    view = memoryview(body)
    pos, members = 0, 0
    pending = b""  # input the last member left over (at most one chunk)
    while pos < len(view) or pending:
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise ValueError(f"the {encoding} body has more than {MAX_GZIP_MEMBERS} members; send one")
        inflater = zlib.decompressobj(wbits)
        while not inflater.eof:
            if pending:
                data, pending = pending, b""
            elif pos < len(view):
                data, pos = view[pos:pos + _CHUNK], pos + _CHUNK
            else:
                raise ValueError(f"the {encoding} body is truncated")
            try:
                out += inflater.decompress(data, limit + 1 - len(out))
            except zlib.error as exc:
                raise ValueError(f"the body is not valid {encoding}: {exc}") from exc
            if len(out) > limit or inflater.unconsumed_tail:
                raise TooLarge
        pending = inflater.unused_data
        if encoding == "deflate" and (pending or pos < len(view)):
            raise ValueError("trailing bytes after the deflate stream")
    return bytes(out)


def _media(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


class HttpReceiver:
    def __init__(self, settings: ServerSettings, ingest: Ingest) -> None:
        self.settings = settings
        self.ingest = ingest
        self.port: int | None = None
        # the raw (still compressed) body may be at most the limit too; decompression is bounded separately
        self.app = web.Application(client_max_size=settings.max_message_bytes)
        self.app.router.add_post(TRACES_PATH, self._traces)
        self.app.router.add_post(LOGS_PATH, self._logs)
        self.app.router.add_post(METRICS_PATH, self._metrics)
        self._site: GuardedSite | None = None

    async def start(self) -> int:
        s = self.settings
        self._site = GuardedSite(self.app, s.host, s.http_port, max_connections=s.max_connections,
                                 header_timeout_s=s.header_timeout_s, ssl_context=self._tls(),
                                 auto_decompress=False)
        self.port = await self._site.start()
        return self.port

    async def stop(self) -> None:
        """Stop accepting and wait for in-flight requests (their spans are committed before they answer)."""
        if self._site is not None:
            await self._site.stop()

    def _tls(self) -> ssl.SSLContext | None:
        s = self.settings
        if not (s.tls_cert and s.tls_key):
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(Path(s.tls_cert), Path(s.tls_key))
        if s.tls_client_ca:
            context.load_verify_locations(Path(s.tls_client_ca))
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    async def _traces(self, request: web.Request) -> web.Response:
        return await self._export(request, "traces")

    async def _logs(self, request: web.Request) -> web.Response:
        return await self._export(request, "logs")

    async def _metrics(self, request: web.Request) -> web.Response:
        """Metrics are no input of an evaluation: checked like any export (token, size, time), then dropped."""
        reply_type = PROTOBUF if _media(request.headers.get("Content-Type", "")) in (PROTOBUF, "application/protobuf") \
            else JSON
        body = await self._body(request, reply_type, decompress_body=False)
        if isinstance(body, web.Response):
            return body
        self.ingest.metrics.requests.labels("http", METRICS_DROPPED).inc()
        if reply_type == PROTOBUF:
            return web.Response(status=200, body=b"", content_type=PROTOBUF)  # an empty ExportMetricsServiceResponse
        return web.Response(status=200, text="{}", content_type=JSON)

    async def _export(self, request: web.Request, signal: Signal) -> web.Response:
        media = _media(request.headers.get("Content-Type", ""))
        if media == "application/protobuf":
            media = PROTOBUF
        reply_type = media if media in (PROTOBUF, JSON) else JSON
        if media not in (PROTOBUF, JSON):
            self.ingest.metrics.requests.labels("http", "unsupported_type").inc()
            return self._status(415, code_pb2.INVALID_ARGUMENT,
                                f"unsupported Content-Type {media or '(none)'!r}: send {PROTOBUF} or {JSON}", JSON)
        body = await self._body(request, reply_type)
        if isinstance(body, web.Response):
            return body
        outcome = await self.ingest.export(body, media, request.headers.get("Authorization"), "http", signal)
        return self._answer(outcome, reply_type, signal)

    async def _body(self, request: web.Request, reply_type: str, decompress_body: bool = True) -> bytes | web.Response:
        """The request's body, decompressed within the size limit and the time its length allows; or the answer
        that refuses it (no bearer token, too large, too slow, not decompressible, backpressure)."""
        if not self.ingest.authorized(request.headers.get("Authorization")):
            self.ingest.metrics.requests.labels("http", "unauthenticated").inc()
            return self._status(401, code_pb2.UNAUTHENTICATED, "missing or wrong bearer token", reply_type,
                                {"WWW-Authenticate": "Bearer"})
        deadline = body_deadline_s(request.content_length, self.settings.max_message_bytes,
                                   self.settings.header_timeout_s)
        try:
            raw = await asyncio.wait_for(self._read(request), deadline)
            if not decompress_body:  # read to its end (bounded), to be dropped
                return raw
            encoding = request.headers.get("Content-Encoding", "")
            # decompressing is CPU work in proportion to the body: off the event loop, so /healthz and every
            # other request keep being answered meanwhile
            return raw if encoding.strip().lower() in ("", "identity") and len(raw) <= self.settings.max_message_bytes \
                else await asyncio.to_thread(decompress, raw, encoding, self.settings.max_message_bytes)
        except (TooLarge, web.HTTPRequestEntityTooLarge):
            self.ingest.metrics.requests.labels("http", "too_large").inc()
            return self._status(413, code_pb2.RESOURCE_EXHAUSTED,
                                f"the request is over the {self.settings.max_message_bytes} byte limit "
                                "(after decompression); send smaller batches", reply_type)
        except ValueError as exc:
            self.ingest.metrics.requests.labels("http", "invalid").inc()
            return self._status(400, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
        except TimeoutError:
            self.ingest.metrics.requests.labels("http", "too_slow").inc()
            return self._status(408, code_pb2.DEADLINE_EXCEEDED, f"the body did not arrive within {deadline:.0f} s; "
                                "send it faster or in smaller batches", reply_type, {"Connection": "close"})
        except Backpressure as exc:
            self.ingest.metrics.requests.labels("http", "unavailable").inc()
            return self._status(503, code_pb2.UNAVAILABLE, str(exc), reply_type,
                                {"Retry-After": str(exc.retry_after_s), "Connection": "close"})

    async def _read(self, request: web.Request) -> bytes:
        """The body, counted against the receiver's in-flight bytes while it arrives (refused up front when
        its declared length would not fit)."""
        # without a length (chunked), the body is charged at the most it may be
        size = request.content_length if request.content_length is not None else self.settings.max_message_bytes
        async with self.ingest.reading(size):
            return await request.read()

    def _answer(self, outcome: Outcome, reply_type: str, signal: Signal) -> web.Response:
        if outcome.answer is Answer.OK:
            response: ExportTraceServiceResponse | ExportLogsServiceResponse
            if signal == "logs":
                response = ExportLogsServiceResponse()
                if outcome.rejected or outcome.message:
                    response.partial_success.CopyFrom(ExportLogsPartialSuccess(
                        rejected_log_records=outcome.rejected, error_message=outcome.message))
            else:
                response = ExportTraceServiceResponse()
                if outcome.rejected or outcome.message:
                    response.partial_success.CopyFrom(ExportTracePartialSuccess(
                        rejected_spans=outcome.rejected, error_message=outcome.message))
            if reply_type == PROTOBUF:
                return web.Response(status=200, body=response.SerializeToString(), content_type=PROTOBUF)
            body: dict = {}
            if outcome.rejected or outcome.message:
                rejected = "rejectedLogRecords" if signal == "logs" else "rejectedSpans"
                body["partialSuccess"] = {rejected: str(outcome.rejected), "errorMessage": outcome.message}
            return web.Response(status=200, text=json.dumps(body), content_type=JSON)
        if outcome.answer is Answer.UNAVAILABLE:
            return self._status(503, code_pb2.UNAVAILABLE, outcome.message, reply_type,
                                {"Retry-After": str(outcome.retry_after_s or 1)})
        if outcome.answer is Answer.UNAUTHENTICATED:
            return self._status(401, code_pb2.UNAUTHENTICATED, outcome.message, reply_type)
        if outcome.answer is Answer.UNSUPPORTED_TYPE:
            return self._status(415, code_pb2.INVALID_ARGUMENT, outcome.message, JSON)
        return self._status(400, code_pb2.INVALID_ARGUMENT, outcome.message, reply_type)

    @staticmethod
    def _status(http: int, code: int, message: str, reply_type: str,
                headers: dict[str, str] | None = None) -> web.Response:
        if reply_type == PROTOBUF:
            body = status_pb2.Status(code=code, message=message).SerializeToString()
            return web.Response(status=http, body=body, content_type=PROTOBUF, headers=headers)
        return web.Response(status=http, text=json.dumps({"code": code, "message": message}), content_type=JSON,
                            headers=headers)
