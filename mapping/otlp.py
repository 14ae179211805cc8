"""Decode an OTLP ExportTraceServiceRequest (protobuf or OTLP/JSON) into normalized spans.

A request that cannot be decoded at all raises OTLPDecodeError (the receiver answers 400 /
INVALID_ARGUMENT). A span that decodes but is invalid (bad or zero ids, negative times) is reported in
`problems` with where it is and why, and the other spans of the request are kept (partial success).
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tracejudge.mapping.content_types import JSON_TYPES, PROTOBUF_TYPES, media_type
from tracejudge.mapping.spans import Span, SpanEvent, SpanLink

MAX_ANY_VALUE_DEPTH = 64


class OTLPDecodeError(ValueError):
    """The request is not a decodable ExportTraceServiceRequest; nothing in it can be kept."""


class UnsupportedContentTypeError(OTLPDecodeError):
    """The content type is neither OTLP protobuf nor OTLP/JSON."""


@dataclass(frozen=True)
class SpanProblem:
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class DecodedRequest:
    spans: list[Span] = field(default_factory=list)
    problems: list[SpanProblem] = field(default_factory=list)
    truncated: int = 0  # spans kept with attributes, events, links or values cut to the limits


@dataclass(frozen=True)
class SpanLimits:
    """OpenTelemetry's span limits, applied as spans are decoded so a hostile request cannot make one span cost
    gigabytes; what is cut is counted (`DecodedRequest.truncated`) and reported to the exporter."""

    attribute_count: int = 4096
    attribute_value_length: int = 16 * 1024 * 1024  # GenAI message attributes hold whole histories
    event_count: int = 1024
    link_count: int = 1024
    event_attribute_count: int = 1024
    max_json_objects: int = 2_000_000  # objects and arrays in one OTLP/JSON request
    # UTF-8 bytes of text one request's rows may hold once decoded: every span's ids, names, attributes, events,
    # links and conversation key, and each distinct resource and scope once. A request past it could not be
    # committed within the store's memory (DuckDB's 96 MB pool holds about 64 MB of appended text), so both
    # decoders refuse it (400) rather than build rows the store can only fail on (503, retried forever).
    request_row_bytes: int = 48 * 1024 * 1024


DEFAULT_LIMITS = SpanLimits()


def _cut(value: Any, length: int) -> tuple[Any, bool]:
    if isinstance(value, str) and len(value) > length:
        return value[:length], True
    if isinstance(value, list) and any(isinstance(v, str) and len(v) > length for v in value):
        return [v[:length] if isinstance(v, str) else v for v in value], True
    return value, False


def _cut_values(attributes: dict[str, Any], length: int) -> bool:
    """Cut string values (and strings in arrays) past `length` in place; whether any was cut."""
    cut = False
    for key, value in attributes.items():
        short, was_cut = _cut(value, length)
        if was_cut:
            attributes[key] = short
            cut = True
    return cut


def _scope(name: str, version: str, limits: SpanLimits) -> tuple[str, str, bool]:
    """The scope's name and version cut to the value-length limit, as attribute values are, and whether either
    was cut."""
    length = limits.attribute_value_length
    return name[:length], version[:length], len(name) > length or len(version) > length


def _limited(span: Span, limits: SpanLimits, cut_before: bool) -> tuple[Span, bool]:
    """The span within the value-length limit, on its events and links too (counts were cut while decoding:
    `cut_before`)."""
    length = limits.attribute_value_length
    cut = _cut_values(span.attributes, length)
    for item in (*span.events, *span.links):
        cut = _cut_values(item.attributes, length) or cut
    return span, cut or cut_before


class _InvalidSpan(ValueError):
    pass


def decode_otlp(payload: bytes | str, content_type: str, limits: SpanLimits = DEFAULT_LIMITS) -> DecodedRequest:
    """Spans of one export request; `content_type` is the HTTP Content-Type (parameters ignored)."""
    media = media_type(content_type)
    if media in PROTOBUF_TYPES:
        if isinstance(payload, str):
            raise OTLPDecodeError("a protobuf request must be bytes")
        return _decode_protobuf(payload, limits)
    if media in JSON_TYPES:
        return _decode_json(payload, limits)
    raise UnsupportedContentTypeError(
        f"unsupported content type {content_type!r}: send application/x-protobuf or application/json"
    )


# --- ids ------------------------------------------------------------------------------------------------


_ZEROS = {8: bytes(8), 16: bytes(16)}


def _id_from_bytes(raw: bytes, size: int, what: str, required: bool = True) -> str | None:
    if len(raw) == size and raw != _ZEROS[size]:
        return raw.hex()  # the common case, first
    if not raw:
        if required:
            raise _InvalidSpan(f"{what} is missing")
        return None
    if len(raw) != size:
        raise _InvalidSpan(f"{what} must be {size} bytes, got {len(raw)}")
    if raw == bytes(size):
        if required:
            raise _InvalidSpan(f"{what} is all zeros, which OTLP forbids")
        return None
    return raw.hex()


def _id_from_text(text: Any, size: int, what: str, required: bool = True) -> str | None:
    if text in (None, ""):
        return _id_from_bytes(b"", size, what, required)
    if not isinstance(text, str):
        raise _InvalidSpan(f"{what} must be a hex string, got {type(text).__name__}")
    if len(text) == size * 2:
        try:
            raw_hex = bytes.fromhex(text)
        except ValueError:
            raw_hex = None
        if raw_hex is not None:
            return _id_from_bytes(raw_hex, size, what, required)
    try:  # protobuf's canonical JSON mapping sends bytes as base64; accept it too
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _InvalidSpan(f"{what} {text[:40]!r} is not {size * 2} hex characters") from None
    return _id_from_bytes(raw, size, what, required)


MAX_TIME_NS = 2**63 - 1  # what the store keeps (int64 nanoseconds: up to the year 2262)


def _time(value: Any, what: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _InvalidSpan(f"{what} must be an integer count of nanoseconds (a number or a decimal string), "
                           f"got {type(value).__name__}")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise _InvalidSpan(f"{what} must be an integer count of nanoseconds, got {str(value)[:40]!r}") from None
    return _in_range(number, what)


def _in_range(number: int, what: str) -> int:
    if number < 0:
        raise _InvalidSpan(f"{what} is negative")
    if number > MAX_TIME_NS:
        raise _InvalidSpan(f"{what} {number} is after the year 2262 (past int64 nanoseconds); send Unix "
                           "nanoseconds")
    return number


# --- protobuf -------------------------------------------------------------------------------------------


def _pb_any(value: Any, depth: int = 0) -> Any:
    if depth > MAX_ANY_VALUE_DEPTH:
        raise _InvalidSpan(f"an attribute value nests deeper than {MAX_ANY_VALUE_DEPTH} levels")
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_pb_any(v, depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _pb_any(kv.value, depth + 1) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


_SCALARS = frozenset({"string_value", "int_value", "bool_value", "double_value"})


def _pb_attrs(items: Any) -> dict[str, Any]:
    return _pb_attrs_cut(items, sys.maxsize)[0]


def _pb_attrs_cut(items: Any, length: int) -> tuple[dict[str, Any], bool]:
    """Attributes with string values cut to `length` characters, and whether any was cut."""
    out: dict[str, Any] = {}
    cut = False
    for kv in items:  # the hot loop of ingest: scalars inline, nested values through _pb_any
        value = kv.value
        text = value.string_value  # most values are non-empty strings: one read, no WhichOneof
        if text:
            if len(text) > length:
                text, cut = text[:length], True
            out[kv.key] = text
            continue
        kind = value.WhichOneof("value")
        if kind in _SCALARS:
            out[kv.key] = getattr(value, kind)
        elif kind is None:
            out[kv.key] = None
        else:
            nested, was_cut = _cut(_pb_any(value), length)
            out[kv.key] = nested
            cut = cut or was_cut
    return out, cut


def _pb_span_record(span: Any, resource: dict[str, Any], scope: Any,
                    limits: SpanLimits = DEFAULT_LIMITS) -> tuple[Span, bool]:
    """The span and whether limits cut it."""
    if not span.name:
        raise _InvalidSpan("name is missing")
    attributes, events, links = span.attributes, span.events, span.links
    cut = (len(attributes) > limits.attribute_count or len(events) > limits.event_count
           or len(links) > limits.link_count)
    if cut:
        attributes, events = attributes[:limits.attribute_count], events[:limits.event_count]
        links = links[:limits.link_count]
    length = limits.attribute_value_length
    span_attributes, values_cut = _pb_attrs_cut(attributes, length)
    event_list: list[SpanEvent] = []
    for e in events:
        event_attributes, event_cut = _pb_attrs_cut(e.attributes[:limits.event_attribute_count], length)
        event_list.append(SpanEvent(e.name, e.time_unix_nano, event_attributes))
        values_cut = values_cut or event_cut or len(e.attributes) > limits.event_attribute_count
    link_list: list[SpanLink] = []
    for lk in links:
        link_attributes, link_cut = _pb_attrs_cut(lk.attributes[:limits.attribute_count], length)
        link_list.append(SpanLink(lk.trace_id.hex(), lk.span_id.hex(), link_attributes))
        values_cut = values_cut or link_cut or len(lk.attributes) > limits.attribute_count
    start, end, status = span.start_time_unix_nano, span.end_time_unix_nano, span.status
    scope_name, scope_version, scope_cut = _scope(scope.name, scope.version, limits)
    record = Span(
        trace_id=_id_from_bytes(span.trace_id, 16, "trace_id"),  # type: ignore[arg-type]
        span_id=_id_from_bytes(span.span_id, 8, "span_id"),  # type: ignore[arg-type]
        parent_span_id=_id_from_bytes(span.parent_span_id, 8, "parent_span_id", required=False),
        name=span.name, kind=span.kind,
        # fixed64 on the wire: never negative, so only the int64 bound is checked here
        start_ns=start if start <= MAX_TIME_NS else _in_range(start, "start_time_unix_nano"),
        end_ns=end if end <= MAX_TIME_NS else _in_range(end, "end_time_unix_nano"),
        status_code=status.code, status_message=status.message,
        attributes=span_attributes, events=event_list, links=link_list,
        resource=resource, scope_name=scope_name, scope_version=scope_version,
    )
    return record, cut or values_cut or scope_cut


def _decode_protobuf(payload: bytes, limits: SpanLimits = DEFAULT_LIMITS) -> DecodedRequest:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except (DecodeError, ValueError, RuntimeError) as exc:
        # One bad span (e.g. invalid UTF-8 in a string) fails the whole parse; split the request at the wire
        # level and parse each span on its own, so only the bad ones are rejected.
        return _decode_protobuf_span_by_span(payload, exc, limits)
    out = DecodedRequest()
    for r, rs in enumerate(request.resource_spans):
        try:
            resource = _pb_attrs(rs.resource.attributes)
        except _InvalidSpan as exc:
            out.problems.append(SpanProblem(f"resource_spans[{r}].resource", str(exc)))
            continue
        for s, ss in enumerate(rs.scope_spans):
            for i, span in enumerate(ss.spans):
                try:
                    _keep(out, *_pb_span_record(span, resource, ss.scope, limits))
                except _InvalidSpan as exc:
                    where = _where(f"resource_spans[{r}].scope_spans[{s}].spans[{i}]", span.trace_id.hex(),
                                   span.span_id.hex())
                    out.problems.append(SpanProblem(where, str(exc)))
    return out


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _length_delimited(buf: bytes) -> list[tuple[int, bytes]]:
    """(field number, bytes) of every length-delimited field of one message; other fields skipped."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("a length-delimited field runs past the end")
            out.append((number, buf[pos:pos + size]))
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != len(buf):
        raise ValueError("trailing bytes")
    return out


def _decode_protobuf_span_by_span(payload: bytes, original: Exception,
                                  limits: SpanLimits = DEFAULT_LIMITS) -> DecodedRequest:
    try:
        groups = [v for n, v in _length_delimited(payload) if n == 1]
    except ValueError:
        raise OTLPDecodeError(f"the body is not a valid OTLP protobuf ExportTraceServiceRequest: {original}") from None
    out = DecodedRequest()
    for r, group in enumerate(groups):
        try:
            fields = _length_delimited(group)
            resource_pb = Resource()
            for number, value in fields:
                if number == 1:
                    resource_pb.ParseFromString(value)
            resource = _pb_attrs(resource_pb.attributes)
        except (DecodeError, ValueError, _InvalidSpan) as exc:
            out.problems.append(SpanProblem(f"resource_spans[{r}]", f"the resource is not valid ({exc}); "
                                            "its spans were rejected"))
            continue
        for s, scope_bytes in enumerate(v for n, v in fields if n == 2):
            scope = InstrumentationScope()
            try:
                scope_fields = _length_delimited(scope_bytes)
                for number, value in scope_fields:
                    if number == 1:
                        scope.ParseFromString(value)
            except (DecodeError, ValueError) as exc:
                out.problems.append(SpanProblem(f"resource_spans[{r}].scope_spans[{s}]",
                                                f"the scope is not valid ({exc}); its spans were rejected"))
                continue
            for i, span_bytes in enumerate(v for n, v in scope_fields if n == 2):
                where = f"resource_spans[{r}].scope_spans[{s}].spans[{i}]"
                span = PbSpan()
                try:
                    span.ParseFromString(span_bytes)
                except (DecodeError, ValueError, RuntimeError) as exc:
                    reason = ("its attribute values nest deeper than protobuf's depth limit" if "depth" in
                              str(exc).lower() else "not a valid Span message (e.g. invalid UTF-8 in a string "
                              "field)")
                    out.problems.append(SpanProblem(where, f"{reason}: {exc}"))
                    continue
                try:
                    _keep(out, *_pb_span_record(span, resource, scope, limits))
                except _InvalidSpan as exc:
                    out.problems.append(SpanProblem(_where(where, span.trace_id.hex(), span.span_id.hex()), str(exc)))
    return out


def _where(path: str, trace_id: str, span_id: str) -> str:
    ids = ", ".join(p for p in (f"trace_id {trace_id}" if trace_id else "", f"span_id {span_id}" if span_id else "")
                    if p)
    return f"{path} ({ids})" if ids else path


# --- JSON -----------------------------------------------------------------------------------------------


def _get(obj: dict[str, Any], camel: str, snake: str | None = None) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None and snake else value


def _json_any(value: Any, depth: int = 0) -> Any:
    if depth > MAX_ANY_VALUE_DEPTH:
        raise _InvalidSpan(f"an attribute value nests deeper than {MAX_ANY_VALUE_DEPTH} levels")
    if not isinstance(value, dict):
        raise _InvalidSpan(f"an AnyValue must be an object, got {type(value).__name__}")
    if "stringValue" in value:
        if not isinstance(value["stringValue"], str):
            raise _InvalidSpan(f"stringValue must be a string, got {type(value['stringValue']).__name__}")
        return value["stringValue"]
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise _InvalidSpan(f"boolValue must be true or false, got {type(value['boolValue']).__name__}")
        return value["boolValue"]
    if "intValue" in value:
        try:
            number = int(value["intValue"])
        except (TypeError, ValueError, OverflowError):
            raise _InvalidSpan(f"intValue {str(value['intValue'])[:40]!r} is not an integer") from None
        if not -(2**63) <= number < 2**63:
            raise _InvalidSpan(f"intValue {str(value['intValue'])[:40]!r} does not fit in 64 bits")
        return number
    if "doubleValue" in value:
        raw = value["doubleValue"]
        try:
            return float(raw)  # "NaN" and "Infinity" arrive as strings in JSON
        except (TypeError, ValueError):
            raise _InvalidSpan(f"doubleValue {str(raw)[:40]!r} is not a number") from None
    if "arrayValue" in value:
        holder = value["arrayValue"] or {}
        values = holder.get("values") if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or not isinstance(values, list | None):
            raise _InvalidSpan("arrayValue must be an object with a 'values' list")
        return [_json_any(v, depth + 1) for v in values or []]
    if "kvlistValue" in value:
        if not isinstance(value["kvlistValue"], dict | None):
            raise _InvalidSpan("kvlistValue must be an object with a 'values' list")
        return _json_attrs((value["kvlistValue"] or {}).get("values") or [], depth + 1)
    if "bytesValue" in value:  # base64 text, as the protobuf path gives it: any other JSON would be stored as is
        if not isinstance(value["bytesValue"], str):
            raise _InvalidSpan(f"bytesValue must be base64 text, got {type(value['bytesValue']).__name__}")
        return value["bytesValue"]
    return None


def _json_attrs(items: Any, depth: int = 0) -> dict[str, Any]:
    if not isinstance(items, list):
        raise _InvalidSpan("attributes must be a list of {key, value}")
    out: dict[str, Any] = {}
    for kv in items:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise _InvalidSpan("every attribute needs a string key")
        out[kv["key"]] = _json_any(kv.get("value") or {}, depth)
    return out


def _keep(out: DecodedRequest, span: Span, cut: bool) -> None:
    out.spans.append(span)
    out.truncated += cut


def _json_span(span: dict[str, Any], resource: dict[str, Any], scope: dict[str, Any],
               limits: SpanLimits = DEFAULT_LIMITS) -> tuple[Span, bool]:
    status = span.get("status") or {}
    if not isinstance(status, dict):
        raise _InvalidSpan("status must be an object")
    kind = span.get("kind", 0)
    if not isinstance(kind, int) or isinstance(kind, bool):
        raise _InvalidSpan(f"kind must be an integer enum value, got {kind!r:.40}")
    name = span.get("name", "")
    if not isinstance(name, str) or not name:
        raise _InvalidSpan("name is missing" if not name else "name must be a string")
    events = []
    raw_events, raw_links = span.get("events") or [], span.get("links") or []
    raw_attributes = span.get("attributes") or []
    if not isinstance(raw_events, list) or not isinstance(raw_links, list):
        raise _InvalidSpan("events and links must be lists")
    cut = isinstance(raw_attributes, list) and len(raw_attributes) > limits.attribute_count \
        or len(raw_events) > limits.event_count or len(raw_links) > limits.link_count
    if cut:
        raw_events, raw_links = raw_events[:limits.event_count], raw_links[:limits.link_count]
        raw_attributes = raw_attributes[:limits.attribute_count]
    for e in raw_events:
        if not isinstance(e, dict):
            raise _InvalidSpan("every event must be an object")
        event_attributes = e.get("attributes") or []
        events.append(SpanEvent(str(e.get("name", "")), _time(_get(e, "timeUnixNano", "time_unix_nano"), "event time"),
                                _json_attrs(event_attributes[:limits.event_attribute_count]
                                            if isinstance(event_attributes, list) else event_attributes)))
    links = []
    for lk in raw_links:
        if not isinstance(lk, dict):
            raise _InvalidSpan("every link must be an object")
        links.append(SpanLink(
            _id_from_text(_get(lk, "traceId", "trace_id"), 16, "link trace_id") or "",
            _id_from_text(_get(lk, "spanId", "span_id"), 8, "link span_id") or "",
            _json_attrs(lk.get("attributes") or []),
        ))
    code = status.get("code", 0)
    scope_name, scope_version, scope_cut = _scope(str(scope.get("name") or ""), str(scope.get("version") or ""),
                                                  limits)
    record = Span(
        trace_id=_id_from_text(_get(span, "traceId", "trace_id"), 16, "trace_id"),  # type: ignore[arg-type]
        span_id=_id_from_text(_get(span, "spanId", "span_id"), 8, "span_id"),  # type: ignore[arg-type]
        parent_span_id=_id_from_text(_get(span, "parentSpanId", "parent_span_id"), 8, "parent_span_id",
                                     required=False),
        name=name, kind=kind,
        start_ns=_time(_get(span, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
        end_ns=_time(_get(span, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano"),
        status_code=code if isinstance(code, int) else 0, status_message=str(status.get("message") or ""),
        attributes=_json_attrs(raw_attributes), events=events, links=links,
        resource=resource, scope_name=scope_name, scope_version=scope_version,
    )
    return _limited(record, limits, cut or scope_cut)


def _decode_json(payload: bytes | str, limits: SpanLimits = DEFAULT_LIMITS) -> DecodedRequest:
    raw = payload.encode() if isinstance(payload, str) else payload
    if raw.count(b"{") + raw.count(b"[") > limits.max_json_objects:  # each costs ~100 bytes once parsed
        raise OTLPDecodeError(f"the body holds more than {limits.max_json_objects} JSON objects and arrays; "
                              "send smaller batches")
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise OTLPDecodeError(f"the body is not valid JSON: {str(exc)[:300]}") from exc
    if not isinstance(body, dict):
        raise OTLPDecodeError("an OTLP/JSON request must be an object with 'resourceSpans'")
    resource_spans = _get(body, "resourceSpans", "resource_spans") or []
    if not isinstance(resource_spans, list):
        raise OTLPDecodeError("'resourceSpans' must be a list")
    out = DecodedRequest()
    for r, rs in enumerate(resource_spans):
        if not isinstance(rs, dict):
            out.problems.append(SpanProblem(f"resourceSpans[{r}]", "must be an object"))
            continue
        try:
            resource = _json_attrs((rs.get("resource") or {}).get("attributes") or [])
        except (_InvalidSpan, AttributeError, TypeError, OverflowError, RecursionError) as exc:
            out.problems.append(SpanProblem(f"resourceSpans[{r}].resource", str(exc)))
            continue
        scope_spans = _get(rs, "scopeSpans", "scope_spans") or []
        if not isinstance(scope_spans, list):
            out.problems.append(SpanProblem(f"resourceSpans[{r}].scopeSpans", "must be a list"))
            continue
        for s, ss in enumerate(scope_spans):
            if not isinstance(ss, dict):
                out.problems.append(SpanProblem(f"resourceSpans[{r}].scopeSpans[{s}]", "must be an object"))
                continue
            scope = ss.get("scope") or {}
            spans = ss.get("spans") or []
            if not isinstance(spans, list):
                out.problems.append(SpanProblem(f"resourceSpans[{r}].scopeSpans[{s}].spans", "must be a list"))
                continue
            for i, span in enumerate(spans):
                path = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                if not isinstance(span, dict):
                    out.problems.append(SpanProblem(path, "must be an object"))
                    continue
                try:
                    _keep(out, *_json_span(span, resource, scope if isinstance(scope, dict) else {}, limits))
                except (_InvalidSpan, TypeError, AttributeError, OverflowError, RecursionError) as exc:
                    where = _where(path, str(_get(span, "traceId", "trace_id") or "")[:40],
                                   str(_get(span, "spanId", "span_id") or "")[:40])
                    out.problems.append(SpanProblem(where, str(exc)))
    return out
