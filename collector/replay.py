"""`tracejudge replay`: send saved OTLP files (traces, and the log records some frameworks write the messages as) to
a running collector over OTLP/HTTP or OTLP/gRPC.

OTLP/JSON files are sent as they are over HTTP; for gRPC they are converted to protobuf (OTLP/JSON is
protobuf's JSON mapping with hex instead of base64 ids). Each request goes to its signal's endpoint: traces to
`/v1/traces` (TraceService), log records to `/v1/logs` (LogsService).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tracejudge.collector.input_files import InputFileError, OTLPRequest, Signal, otlp_requests
from tracejudge.errors import TracejudgeError

ID_KEYS = ("traceId", "spanId", "parentSpanId")


class _Wire(NamedTuple):
    """What one signal's export looks like: its gRPC method, request and response messages, and the field of its
    partial success that counts what was rejected."""

    method: str
    request: type[Message]
    response: type[Message]
    rejected: str  # protobuf field name
    rejected_json: str  # OTLP/JSON field name


WIRES: dict[Signal, _Wire] = {
    "traces": _Wire("/opentelemetry.proto.collector.trace.v1.TraceService/Export", ExportTraceServiceRequest,
                    ExportTraceServiceResponse, "rejected_spans", "rejectedSpans"),
    "logs": _Wire("/opentelemetry.proto.collector.logs.v1.LogsService/Export", ExportLogsServiceRequest,
                  ExportLogsServiceResponse, "rejected_log_records", "rejectedLogRecords"),
}


class ReplayError(TracejudgeError):
    """A file cannot be read or converted."""


@dataclass
class ReplayReport:
    requests: int = 0
    rejected_spans: int = 0
    rejected_log_records: int = 0
    failures: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    sent_to: list[str] = field(default_factory=list)  # each endpoint requests went to, in order

    def went_to(self, endpoint: str) -> None:
        """One request sent, to this endpoint (listed once, in order, for the summary line)."""
        self.requests += 1
        if endpoint not in self.sent_to:
            self.sent_to.append(endpoint)

    @property
    def rejected(self) -> int:
        """Spans and log records the collector refused."""
        return self.rejected_spans + self.rejected_log_records

    def count(self, signal: Signal, rejected: int) -> None:
        """What one request's partial success refused, counted under its signal."""
        if signal == "logs":
            self.rejected_log_records += rejected
        else:
            self.rejected_spans += rejected


def requests_in(path: Path) -> Iterator[OTLPRequest]:
    """Each export request of a file: .pb protobuf, else OTLP/JSON or JSON Lines; traces or logs."""
    try:
        yield from otlp_requests(path)
    except InputFileError as exc:
        raise ReplayError(str(exc)) from exc


def http_signal_url(endpoint: str, signal: Signal = "traces") -> str:
    """The URL a signal's requests go to, by OTel's rule for a base URL (OTEL_EXPORTER_OTLP_ENDPOINT): `/v1/traces`
    or `/v1/logs` added to its path (`http://host:4318` or `http://host/otlp`). An endpoint that already ends in
    one signal's path is taken as that base with it: log records go to the `/v1/logs` beside a `/v1/traces`."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    base = parts.path.rstrip("/")
    for suffix in ("/v1/traces", "/v1/logs"):
        base = base.removesuffix(suffix)
    return urlunsplit(parts._replace(path=f"{base}/v1/{signal}"))


def grpc_target(endpoint: str) -> str:
    """`host:port` from `http://host:port` or `host:port` (the form OTEL_EXPORTER_OTLP_ENDPOINT uses)."""
    return urlsplit(endpoint).netloc if "://" in endpoint else endpoint


def _hex_ids_to_base64(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ID_KEYS and isinstance(v, str) and v
                    else _hex_ids_to_base64(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_hex_ids_to_base64(v) for v in value]
    return value


def json_to_protobuf(payload: bytes, signal: Signal = "traces") -> bytes:
    try:
        body = _hex_ids_to_base64(json.loads(payload))
        return json_format.ParseDict(body, WIRES[signal].request(), ignore_unknown_fields=True).SerializeToString()
    except (ValueError, json_format.ParseError) as exc:
        raise ReplayError(f"cannot convert OTLP/JSON to protobuf for gRPC: {exc}") from exc


def replay(files: list[Path], protocol: str, endpoint: str, token: str | None, timeout: float = 30) -> ReplayReport:
    report = ReplayReport()
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if protocol == "http":
        with httpx.Client(timeout=timeout) as client:
            for path in files:
                for request in requests_in(path):
                    wire, url = WIRES[request.signal], http_signal_url(endpoint, request.signal)
                    report.went_to(url)
                    reply = client.post(url, content=request.payload,
                                        headers={**headers, "Content-Type": request.content_type})
                    if reply.status_code != 200:
                        report.failures.append(f"{path}: HTTP {reply.status_code}: {reply.text[:300]}")
                        continue
                    if request.content_type == "application/json":
                        partial = (reply.json() or {}).get("partialSuccess") or {}
                        rejected, message = int(partial.get(wire.rejected_json) or 0), partial.get("errorMessage", "")
                    else:
                        response = wire.response.FromString(reply.content)
                        rejected = getattr(response.partial_success, wire.rejected)
                        message = response.partial_success.error_message
                    report.count(request.signal, rejected)
                    if message:
                        report.messages.append(f"{path}: {message}")
        return report
    with grpc.insecure_channel(grpc_target(endpoint)) as channel:
        exports = {signal: channel.unary_unary(wire.method, request_serializer=None,
                                               response_deserializer=wire.response.FromString)
                   for signal, wire in WIRES.items()}
        for path in files:
            for request in requests_in(path):
                report.went_to(f"{grpc_target(endpoint)} ({WIRES[request.signal].method.split('/')[1]})")
                body = request.payload if request.content_type == "application/x-protobuf" \
                    else json_to_protobuf(request.payload, request.signal)
                try:
                    response = exports[request.signal](body, timeout=timeout, metadata=tuple(headers.items()))
                except grpc.RpcError as exc:
                    report.failures.append(f"{path}: {exc.code().name}: {exc.details()}")
                    continue
                report.count(request.signal, getattr(response.partial_success, WIRES[request.signal].rejected))
                if response.partial_success.error_message:
                    report.messages.append(f"{path}: {response.partial_success.error_message}")
    return report
