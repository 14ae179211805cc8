"""GenAI events sent as OTLP log records (ExportLogsServiceRequest, protobuf or OTLP/JSON), kept with the span
they belong to.

Instrumentations in event mode (OTel's GenAI instrumentations with content capture to events, ADK with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`) log each message as a record named
`gen_ai.user.message`, `gen_ai.choice`, `gen_ai.client.inference.operation.details` ... with the trace and span
id of the LLM span. Each such record becomes a *carrier span*: a child of that span, in scope
`tracejudge.log_event`, holding the record as its one event (attributes plus the body's fields). Carriers go
through the same store as spans (so they are durable and redelivery-safe: their id hashes the record), and
`log_events.fold_log_events` puts their events back on the span they name before a conversation is built. Records that
are no GenAI event, or name no span, are accepted and dropped, except evaluation results that name a conversation
instead (end-user feedback: `gen_ai.evaluation.result` with `gen_ai.conversation.id`): their carrier starts a trace of
its own, keyed by that conversation, so the feedback waits for the conversation however late either arrives.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tracejudge.mapping.content_types import JSON_TYPES, PROTOBUF_TYPES, media_type
from tracejudge.mapping.log_events import LOG_EVENT_SCOPE
from tracejudge.mapping.otlp import (
    DEFAULT_LIMITS,
    DecodedRequest,
    OTLPDecodeError,
    SpanProblem,
    UnsupportedContentTypeError,
    _get,
    _id_from_bytes,
    _id_from_text,
    _InvalidSpan,
    _json_any,
    _json_attrs,
    _pb_any,
    _pb_attrs,
    _time,
)
from tracejudge.mapping.spans import Span, SpanEvent

EVENT_PREFIX = "gen_ai."
EVALUATION_EVENT = "gen_ai.evaluation.result"
CONVERSATION_ID = "gen_ai.conversation.id"


def decode_otlp_logs(payload: bytes | str, content_type: str) -> DecodedRequest:
    """Carrier spans for the GenAI events of one logs export request; bad records are `problems`."""
    media = media_type(content_type)
    if media in PROTOBUF_TYPES:
        if isinstance(payload, str):
            raise OTLPDecodeError("a protobuf request must be bytes")
        return _decode_protobuf(payload)
    if media in JSON_TYPES:
        return _decode_json(payload)
    raise UnsupportedContentTypeError(
        f"unsupported content type {content_type!r}: send application/x-protobuf or application/json")


def _carrier(trace_id: str | None, span_id: str | None, event_name: str, time_ns: int, attributes: dict[str, Any],
             body: Any, resource: dict[str, Any]) -> Span | None:
    if not event_name.startswith(EVENT_PREFIX):
        return None
    fields = {k: v for k, v in attributes.items() if k != "event.name"}
    if isinstance(body, dict):
        fields = {**body, **fields}
    elif body is not None:
        fields.setdefault("content", body)
    if trace_id is None or span_id is None:
        conversation = fields.get(CONVERSATION_ID)
        if event_name != EVALUATION_EVENT or not isinstance(conversation, str) or not conversation:
            return None
        return feedback_carrier(conversation, time_ns, fields, resource)
    digest = hashlib.sha256(json.dumps([trace_id, span_id, event_name, time_ns, fields], sort_keys=True,
                                       default=str, ensure_ascii=False).encode()).hexdigest()
    carrier_id = digest[:16] if digest[:16] != "0" * 16 else "1" * 16
    return Span(trace_id=trace_id, span_id=carrier_id, parent_span_id=span_id, name=event_name, kind=0,
                start_ns=time_ns, end_ns=time_ns, events=[SpanEvent(event_name, time_ns, fields)],
                resource=resource, scope_name=LOG_EVENT_SCOPE)


def feedback_carrier(conversation_id: str, time_ns: int, fields: dict[str, Any],
                     resource: dict[str, Any] | None = None) -> Span:
    """An evaluation result about a whole conversation (end-user feedback), named by its conversation id alone: a
    trace of its own, keyed by the conversation (so it is grouped with it), its id a hash of the record (so a
    redelivered record is stored once)."""
    digest = hashlib.sha256(json.dumps([conversation_id, time_ns, fields], sort_keys=True, default=str,
                                       ensure_ascii=False).encode()).hexdigest()
    return Span(trace_id=digest[:32], span_id=digest[32:48], parent_span_id=None, name=EVALUATION_EVENT, kind=0,
                start_ns=time_ns, end_ns=time_ns, attributes={CONVERSATION_ID: conversation_id},
                events=[SpanEvent(EVALUATION_EVENT, time_ns, {**fields, CONVERSATION_ID: conversation_id})],
                resource=resource or {}, scope_name=LOG_EVENT_SCOPE)


def _decode_protobuf(payload: bytes) -> DecodedRequest:
    request = ExportLogsServiceRequest()
    try:
        request.ParseFromString(payload)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OTLPDecodeError(f"the body is not a valid OTLP protobuf ExportLogsServiceRequest: {exc}") from None
    out = DecodedRequest()
    for r, rl in enumerate(request.resource_logs):
        try:
            resource = _pb_attrs(rl.resource.attributes)
        except _InvalidSpan as exc:
            out.problems.append(SpanProblem(f"resource_logs[{r}].resource", str(exc)))
            continue
        for s, sl in enumerate(rl.scope_logs):
            for i, record in enumerate(sl.log_records):
                try:
                    attributes = _pb_attrs(record.attributes)
                    name = record.event_name or str(attributes.get("event.name") or "")
                    carrier = _carrier(
                        _id_from_bytes(record.trace_id, 16, "trace_id", required=False),
                        _id_from_bytes(record.span_id, 8, "span_id", required=False),
                        name, record.time_unix_nano or record.observed_time_unix_nano, attributes,
                        _pb_any(record.body) if record.HasField("body") else None, resource)
                except _InvalidSpan as exc:
                    out.problems.append(SpanProblem(f"resource_logs[{r}].scope_logs[{s}].log_records[{i}]",
                                                    str(exc)))
                    continue
                if carrier is not None:
                    out.spans.append(carrier)
    return out


def _decode_json(payload: bytes | str) -> DecodedRequest:
    raw = payload.encode() if isinstance(payload, str) else payload
    if raw.count(b"{") + raw.count(b"[") > DEFAULT_LIMITS.max_json_objects:
        raise OTLPDecodeError(f"the body holds more than {DEFAULT_LIMITS.max_json_objects} JSON objects and arrays; "
                              "send smaller batches")
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise OTLPDecodeError(f"the body is not valid JSON: {str(exc)[:300]}") from exc
    resource_logs = _get(body, "resourceLogs", "resource_logs") if isinstance(body, dict) else None
    if not isinstance(resource_logs, list | None):
        raise OTLPDecodeError("'resourceLogs' must be a list")
    if not isinstance(body, dict):
        raise OTLPDecodeError("an OTLP/JSON logs request must be an object with 'resourceLogs'")
    out = DecodedRequest()
    for r, rl in enumerate(resource_logs or []):
        for s, sl in enumerate(_get(rl, "scopeLogs", "scope_logs") or [] if isinstance(rl, dict) else []):
            records = _get(sl, "logRecords", "log_records") if isinstance(sl, dict) else None
            for i, record in enumerate(records if isinstance(records, list) else []):
                where = f"resourceLogs[{r}].scopeLogs[{s}].logRecords[{i}]"
                try:
                    if not isinstance(record, dict):
                        raise _InvalidSpan("must be an object")
                    resource = _json_attrs((rl.get("resource") or {}).get("attributes") or [])
                    attributes = _json_attrs(record.get("attributes") or [])
                    name = _get(record, "eventName", "event_name") or attributes.get("event.name") or ""
                    carrier = _carrier(
                        _id_from_text(_get(record, "traceId", "trace_id"), 16, "trace_id", required=False),
                        _id_from_text(_get(record, "spanId", "span_id"), 8, "span_id", required=False),
                        str(name), _time(_get(record, "timeUnixNano", "time_unix_nano")
                                         or _get(record, "observedTimeUnixNano", "observed_time_unix_nano"),
                                         "timeUnixNano"),
                        attributes, _json_any(record["body"]) if record.get("body") else None, resource)
                except (_InvalidSpan, TypeError, AttributeError, OverflowError, RecursionError) as exc:
                    out.problems.append(SpanProblem(where, str(exc)))
                    continue
                if carrier is not None:
                    out.spans.append(carrier)
    return out
