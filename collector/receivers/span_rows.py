"""Spans as the Arrow rows of the `spans` table: what the Python decoder's spans become in a decode worker, and
what the server makes of the C walk's column buffers.

Kept apart from the store so that a decode worker process imports pyarrow and the mapping, not DuckDB.
"""

from __future__ import annotations

import json
import math
import operator
import re
from array import array
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from collector.receivers.otlp_columns import FIXED_COLUMNS, STRING_COLUMNS, NativeColumns
from collector.receivers.request_digest import ids_digest
from mapping.conversation_key import resource_conversation_key, span_own_conversation_key
from mapping.otlp import OTLPDecodeError, SpanLimits, SpanProblem, decode_otlp
from mapping.otlp_logs import decode_otlp_logs
from mapping.spans import Span

if TYPE_CHECKING:
    from mapping.redaction import Redactor

# The JSON columns carry Arrow's JSON extension type: DuckDB then takes them as JSON as they are instead of
# parsing every value to check it (about 1 us per row of the writer's time; `python bench/span_append.py`).
# That is safe because `to_json` below only ever writes strict JSON.
JSON_TEXT = pa.json_(pa.string())
SPANS_SCHEMA = pa.schema([
    ("trace_id", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()), ("name", pa.string()),
    ("kind", pa.int8()), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("status_code", pa.int8()),
    ("status_message", pa.string()), ("service_name", pa.string()), ("scope_name", pa.string()),
    ("scope_version", pa.string()), ("attributes", JSON_TEXT), ("resource_attributes", JSON_TEXT),
    ("events", JSON_TEXT), ("links", JSON_TEXT), ("conversation_key", pa.string()),
    ("conversation_key_source", pa.string()), ("received_at", pa.timestamp("us", tz="UTC")),
])
MAX_INT64 = 2**63 - 1
# Every row stores its resource's attributes: a request of one large resource and many small spans would
# otherwise make gigabytes of rows from 16 MiB (the C walk leaves such a request to this decoder, which refuses it).
MAX_REPEATED_RESOURCE = 256 * 2**20


def plain_strings(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A JSON column as plain strings, for Arrow compute kernels that do not take the extension type."""
    if isinstance(column.type, pa.BaseExtensionType):
        return pa.chunked_array([chunk.storage for chunk in column.chunks], column.type.storage_type)
    return column



def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=str)


def _flat_and_finite(value: Any) -> bool:
    """Attributes of scalars with no NaN or Infinity: any `null` orjson wrote is a real None (or text)."""
    return isinstance(value, dict) and all(
        v is None or type(v) in (str, int, bool) or (type(v) is float and math.isfinite(v)) for v in value.values())


def to_json(value: Any) -> str:
    """Strict JSON DuckDB's JSON type accepts: NaN and Infinity as strings, lone surrogates as U+FFFD (keys that
    only differed in them stay distinct). orjson writes the common case (9x faster, `python bench/decode.py`);
    what it cannot write as we want (lone surrogates, ints past 64 bits: it raises; NaN: it writes null, so
    a null that could be one) goes the standard library's way."""
    try:
        fast = orjson.dumps(value, default=str)
    except (orjson.JSONEncodeError, TypeError):
        fast = None
    if fast is not None and (b"null" not in fast or _flat_and_finite(value)):
        return fast.decode()
    try:
        text = _ENCODER.encode(value)
    except ValueError:
        text = _ENCODER.encode(_finite(value))
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _ENCODER.encode(_scrub(value))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub(value: Any) -> Any:
    """Lone surrogates (JSON's `\\ud800` escapes decode to them) as U+FFFD, numbering keys that would collide."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            clean = _scrub(str(key))
            unique, n = clean, 1
            while unique in out:
                n += 1
                unique = f"{clean} ({n})"
            out[unique] = _scrub(item)
        return out
    return _finite(value) if isinstance(value, float) else value


def _text(value: str) -> str:
    if value.isascii() or not _SURROGATE.search(value):
        return value
    return _SURROGATE.sub("\ufffd", value)


def _clamp(ns: int) -> int:
    return min(max(ns, 0), MAX_INT64)


def spans_to_arrow(spans: list[Span], received_at: datetime) -> pa.Table:
    """Columns of the spans table; one row per (trace_id, span_id), the last delivery winning in a batch."""
    unique = {s.key: s for s in spans}
    columns: dict[str, list[Any]] = {name: [] for name in SPANS_SCHEMA.names}
    resources: dict[int, tuple[str, tuple[str, str] | None]] = {}  # spans of one request share their resource
    c_trace, c_span, c_parent = columns["trace_id"], columns["span_id"], columns["parent_span_id"]
    c_name, c_kind, c_start, c_end = columns["name"], columns["kind"], columns["start_ns"], columns["end_ns"]
    c_code, c_message, c_service = columns["status_code"], columns["status_message"], columns["service_name"]
    c_scope, c_version, c_attrs = columns["scope_name"], columns["scope_version"], columns["attributes"]
    c_resource, c_events, c_links = columns["resource_attributes"], columns["events"], columns["links"]
    c_key, c_source = columns["conversation_key"], columns["conversation_key_source"]
    repeated = 0  # characters of resource JSON the rows will hold: each row carries its resource's
    for s in unique.values():
        cached = resources.get(id(s.resource))
        if cached is None:
            cached = resources[id(s.resource)] = (to_json(s.resource), resource_conversation_key(s.resource))
        resource_json, resource_key = cached
        repeated += len(resource_json)
        if repeated > MAX_REPEATED_RESOURCE:
            raise OTLPDecodeError(
                f"the request's resource attributes, stored with each of its {len(unique)} spans, come to more than "
                f"{MAX_REPEATED_RESOURCE // 2**20} MiB ({len(resource_json):,} characters on one resource): send "
                "fewer spans per request, or fewer or shorter resource attributes")
        key = span_own_conversation_key(s) or resource_key
        c_trace.append(s.trace_id)
        c_span.append(s.span_id)
        c_parent.append(s.parent_span_id)
        c_name.append(_text(s.name))
        c_kind.append(s.kind if -128 <= s.kind <= 127 else 0)
        c_start.append(_clamp(s.start_ns))
        c_end.append(_clamp(s.end_ns))
        c_code.append(s.status_code if -128 <= s.status_code <= 127 else 0)
        c_message.append(_text(s.status_message))
        service = s.resource.get("service.name")
        c_service.append(_text(service) if isinstance(service, str) else None)
        c_scope.append(_text(s.scope_name))
        c_version.append(_text(s.scope_version))
        c_attrs.append(to_json(s.attributes))
        c_resource.append(resource_json)
        c_events.append(to_json([{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes}
                                 for e in s.events]) if s.events else "[]")
        c_links.append(to_json([{"trace_id": lk.trace_id, "span_id": lk.span_id, "attributes": lk.attributes}
                                for lk in s.links]) if s.links else "[]")
        c_key.append(_text(key[1]) if key else None)
        c_source.append(key[0] if key else None)
    columns["received_at"] = [received_at] * len(unique)
    return pa.table(columns, schema=SPANS_SCHEMA)


def request_digest(table: pa.Table) -> bytes:
    """The request digest (`request_digest.ids_digest`) of a table's rows. In Python, not Arrow compute: importing
    pyarrow.compute would cost each decode worker 11 MB for a sort of a few hundred hex strings."""
    return ids_digest([key.encode() for key in map(operator.add, table.column("trace_id").to_pylist(),
                                                   table.column("span_id").to_pylist())])


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def columns_to_arrow(native: NativeColumns) -> pa.Table:
    """The C walk's column buffers as the table `spans_to_arrow` builds (zero-copy over the buffers)."""
    rows, arrays = native.rows, {}
    for name, data in zip(FIXED_COLUMNS, native.fixed, strict=True):
        arrays[name] = pa.Array.from_buffers(SPANS_SCHEMA.field(name).type, rows, [None, pa.py_buffer(data)])
    for name, (offsets, data, validity, nulls) in zip(STRING_COLUMNS, native.strings, strict=True):
        kind = SPANS_SCHEMA.field(name).type
        storage = pa.Array.from_buffers(
            pa.string(), rows, [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
                                pa.py_buffer(data)], null_count=nulls)
        arrays[name] = pa.ExtensionArray.from_storage(kind, storage) if isinstance(kind, pa.BaseExtensionType) \
            else storage
    arrays["received_at"] = pa.Array.from_buffers(SPANS_SCHEMA.field("received_at").type, rows,
                                                  [None, pa.py_buffer(array("q", [native.received_us]) * rows)])
    return pa.table([arrays[name] for name in SPANS_SCHEMA.names], schema=SPANS_SCHEMA)


def decode_to_arrow(payload: bytes, content_type: str, redactor: Redactor | None, signal: str,
                    limits: tuple[int, ...], received_us: int) -> tuple[pa.Table, list[SpanProblem], int]:
    """The Python decoder's rows of a request (`decode_worker` falls back to it), its problems and cut spans."""
    span_limits = SpanLimits(*limits)
    decoded = decode_otlp(payload, content_type, span_limits) if signal == "traces" else \
        decode_otlp_logs(payload, content_type)
    spans = redactor.spans(decoded.spans) if redactor is not None else decoded.spans
    received_at = _EPOCH + timedelta(microseconds=received_us)
    return spans_to_arrow(spans, received_at), decoded.problems, decoded.truncated


def decode_to_ipc(payload: bytes, content_type: str, redactor: Redactor | None, signal: str,
                  limits: tuple[int, ...], received_us: int) -> tuple[bytes, int, list[SpanProblem], int, bytes]:
    """`decode_to_arrow` as a decode worker answers: the rows as Arrow IPC bytes, and the request digest."""
    table, problems, truncated = decode_to_arrow(payload, content_type, redactor, signal, limits, received_us)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes(), table.num_rows, problems, truncated, request_digest(table)
