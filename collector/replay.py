"""`tracejudge replay`: send saved trace files to a running collector over OTLP/HTTP or OTLP/gRPC.

OTLP/JSON files are sent as they are over HTTP; for gRPC they are converted to protobuf (OTLP/JSON is
protobuf's JSON mapping with hex instead of base64 ids).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tracejudge.collector.input_files import InputFileError, trace_requests
from tracejudge.errors import TracejudgeError

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
ID_KEYS = ("traceId", "spanId", "parentSpanId")


class ReplayError(TracejudgeError):
    """A trace file cannot be read or converted."""


@dataclass
class ReplayReport:
    requests: int = 0
    rejected_spans: int = 0
    failures: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def requests_in(path: Path) -> Iterator[tuple[bytes, str]]:
    """(payload, content type) of each export request in a file: .pb protobuf, else OTLP/JSON or JSON Lines."""
    try:
        for _, payload, content_type in trace_requests(path):
            yield payload, content_type
    except InputFileError as exc:
        raise ReplayError(str(exc)) from exc


def http_traces_url(endpoint: str) -> str:
    """OTel exporters take the base URL (`http://host:4318`) and add `/v1/traces`; so does replay."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/traces")
    return urlunsplit(parts)


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


def json_to_protobuf(payload: bytes) -> bytes:
    try:
        body = _hex_ids_to_base64(json.loads(payload))
        return json_format.ParseDict(body, ExportTraceServiceRequest(), ignore_unknown_fields=True).SerializeToString()
    except (ValueError, json_format.ParseError) as exc:
        raise ReplayError(f"cannot convert OTLP/JSON to protobuf for gRPC: {exc}") from exc


def replay(files: list[Path], protocol: str, endpoint: str, token: str | None, timeout: float = 30) -> ReplayReport:
    report = ReplayReport()
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if protocol == "http":
        endpoint = http_traces_url(endpoint)
        with httpx.Client(timeout=timeout) as client:
            for path in files:
                for payload, content_type in requests_in(path):
                    report.requests += 1
                    reply = client.post(endpoint, content=payload, headers={**headers, "Content-Type": content_type})
                    if reply.status_code != 200:
                        report.failures.append(f"{path}: HTTP {reply.status_code}: {reply.text[:300]}")
                        continue
                    if content_type == "application/json":
                        partial = (reply.json() or {}).get("partialSuccess") or {}
                        rejected, message = int(partial.get("rejectedSpans") or 0), partial.get("errorMessage", "")
                    else:
                        response = ExportTraceServiceResponse.FromString(reply.content)
                        rejected = response.partial_success.rejected_spans
                        message = response.partial_success.error_message
                    report.rejected_spans += rejected
                    if message:
                        report.messages.append(f"{path}: {message}")
        return report
    with grpc.insecure_channel(grpc_target(endpoint)) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None,
                                     response_deserializer=ExportTraceServiceResponse.FromString)
        for path in files:
            for payload, content_type in requests_in(path):
                report.requests += 1
                body = payload if content_type == "application/x-protobuf" else json_to_protobuf(payload)
                try:
                    response = export(body, timeout=timeout, metadata=tuple(headers.items()))
                except grpc.RpcError as exc:
                    report.failures.append(f"{path}: {exc.code().name}: {exc.details()}")
                    continue
                report.rejected_spans += response.partial_success.rejected_spans
                if response.partial_success.error_message:
                    report.messages.append(f"{path}: {response.partial_success.error_message}")
    return report
