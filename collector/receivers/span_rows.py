"""Spans as the Arrow rows of the `spans` table: what the Python decoder's spans become in a decode worker, and
what the server makes of the C walk's column buffers.

Kept apart from the store so that a decode worker process imports pyarrow and the mapping, not DuckDB.
"""

from __future__ import annotations

import math
import operator
import re
from array import array
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from tracejudge.collector.receivers.otlp_columns import FIXED_COLUMNS, STRING_COLUMNS, NativeColumns
from tracejudge.collector.receivers.request_digest import ids_digest
from tracejudge.collector.store.span_tables import SpanRows, resource_id, scope_id
from tracejudge.mapping.conversation_key import resource_conversation_key, span_own_conversation_key
from tracejudge.mapping.otlp import DEFAULT_LIMITS, OTLPDecodeError, SpanLimits, SpanProblem, decode_otlp
from tracejudge.mapping.otlp_logs import decode_otlp_logs
from tracejudge.mapping.spans import Span

if TYPE_CHECKING:
    from tracejudge.mapping.redaction import Redactor

# The JSON columns carry Arrow's JSON extension type: DuckDB then takes them as JSON as they are instead of
# parsing every value to check it (about 1 us per row of the writer's time; `python bench/span_append.py`).
# That is safe because `to_json` below only ever writes strict JSON.
JSON_TEXT = pa.json_(pa.string())
# The rows of `span_records`: each span with the ids of its resource and scope, which are stored once per content in
# `span_resources` and `span_scopes` (collector/store/span_tables.py); the `spans` view joins them back.
SPANS_SCHEMA = pa.schema([
    ("trace_id", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()), ("name", pa.string()),
    ("kind", pa.int8()), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("status_code", pa.int8()),
    ("status_message", pa.string()), ("resource_id", pa.int64()), ("scope_id", pa.int64()),
    ("attributes", JSON_TEXT), ("events", JSON_TEXT), ("links", JSON_TEXT), ("conversation_key", pa.string()),
    ("conversation_key_source", pa.string()), ("received_at", pa.timestamp("us", tz="UTC")),
])
RESOURCES_SCHEMA = pa.schema([("resource_id", pa.int64()), ("service_name", pa.string()),
                              ("attributes", JSON_TEXT)])
SCOPES_SCHEMA = pa.schema([("scope_id", pa.int64()), ("name", pa.string()), ("version", pa.string())])
MAX_INT64 = 2**63 - 1


def too_many_row_bytes(limit: int, spans: int) -> OTLPDecodeError:
    """The final answer to a request whose rows would hold more than `limit` bytes: it could never be committed."""
    return OTLPDecodeError(
        f"the request's rows would hold more than {limit // 2**20} MiB of text once decoded (after {spans:,} "
        "spans: attributes, events and links as JSON, each distinct resource and scope once): send fewer or smaller "
        "spans per request, or raise [limits] request_row_bytes together with [store] memory_limit")


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


def _flat_and_finite(value: Any) -> bool:
    """Attributes of scalars with no NaN or Infinity: any `null` orjson wrote is a real None (or text)."""
    return isinstance(value, dict) and all(
        v is None or type(v) in (str, int, bool) or (type(v) is float and math.isfinite(v)) for v in value.values())


def to_json(value: Any) -> str:
    """Strict JSON DuckDB's JSON type accepts: NaN and Infinity as strings, lone surrogates as U+FFFD (keys that
    only differed in them stay distinct). orjson writes the common case (9x faster, `python bench/decode.py`);
    what it cannot write as we want (lone surrogates, ints past 64 bits: it raises; NaN: it writes null, so
    a null that could be one) goes through `_written`, which writes numbers and strings as orjson does, so equal
    values are equal text whichever way they went (and whichever decoder: the C walk writes floats with orjson)."""
    try:
        fast = orjson.dumps(value, default=str)
    except (orjson.JSONEncodeError, TypeError):
        fast = None
    if fast is not None and (b"null" not in fast or _flat_and_finite(value)):
        return fast.decode()
    return _written(_scrub(value))


def _written(value: Any) -> str:
    """JSON text of a scrubbed value (`_scrub`: no lone surrogates, no NaN), every leaf as orjson writes it."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))  # past 64 bits too, where orjson refuses
    if isinstance(value, dict):
        return "{" + ",".join(orjson.dumps(str(k)).decode() + ":" + _written(v) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_written(v) for v in value) + "]"
    if isinstance(value, float) and math.isfinite(value) or isinstance(value, str):
        return orjson.dumps(value).decode()
    return orjson.dumps(str(value)).decode()


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


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def spans_to_arrow(spans: list[Span], received_at: datetime,
                   row_bytes: int = DEFAULT_LIMITS.request_row_bytes) -> SpanRows:
    """Rows of the spans and of their resources and scopes; one span row per (trace_id, span_id), the last
    delivery winning in a batch. OTLPDecodeError when the rows would hold more than `row_bytes` of text, counted
    as the C walk counts its buffers (every string column of the rows, and each resource and scope) before any
    column is built."""
    unique = {s.key: s for s in spans}
    columns: dict[str, list[Any]] = {name: [] for name in SPANS_SCHEMA.names}
    resources: dict[int, tuple[int, tuple[str, str] | None]] = {}  # spans of one request share their resource
    resource_rows: dict[int, tuple[str | None, str]] = {}
    scopes: dict[tuple[str, str], int] = {}
    c_trace, c_span, c_parent = columns["trace_id"], columns["span_id"], columns["parent_span_id"]
    c_name, c_kind, c_start, c_end = columns["name"], columns["kind"], columns["start_ns"], columns["end_ns"]
    c_code, c_message, c_attrs = columns["status_code"], columns["status_message"], columns["attributes"]
    c_resource, c_scope, c_events, c_links = (columns["resource_id"], columns["scope_id"], columns["events"],
                                              columns["links"])
    c_key, c_source = columns["conversation_key"], columns["conversation_key_source"]
    total = 0  # UTF-8 bytes of text the rows hold
    for s in unique.values():
        cached = resources.get(id(s.resource))
        if cached is None:
            resource_json = to_json(s.resource)
            service = s.resource.get("service.name")
            service = _text(service) if isinstance(service, str) else None
            rid = resource_id(resource_json.encode())
            cached = resources[id(s.resource)] = (rid, resource_conversation_key(s.resource))
            if rid not in resource_rows:
                resource_rows[rid] = (service, resource_json)
                total += _utf8(resource_json) + (_utf8(service) if service is not None else 0)
        rid, resource_key = cached
        scope = (_text(s.scope_name), _text(s.scope_version))
        sid = scopes.get(scope)
        if sid is None:
            sid = scopes[scope] = scope_id(scope[0].encode(), scope[1].encode())
            total += _utf8(scope[0]) + _utf8(scope[1])
        key = span_own_conversation_key(s) or resource_key
        name, message = _text(s.name), _text(s.status_message)
        attributes = to_json(s.attributes)
        events = to_json([{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes}
                          for e in s.events]) if s.events else "[]"
        links = to_json([{"trace_id": lk.trace_id, "span_id": lk.span_id, "attributes": lk.attributes}
                         for lk in s.links]) if s.links else "[]"
        key_text = _text(key[1]) if key else None
        total += (len(s.trace_id) + len(s.span_id) + len(s.parent_span_id or "") + _utf8(name) + _utf8(message)
                  + _utf8(attributes) + _utf8(events) + _utf8(links)
                  + (_utf8(key_text) + len(key[0]) if key_text is not None and key else 0))
        if total > row_bytes:
            raise too_many_row_bytes(row_bytes, len(c_trace) + 1)
        c_trace.append(s.trace_id)
        c_span.append(s.span_id)
        c_parent.append(s.parent_span_id)
        c_name.append(name)
        c_kind.append(s.kind if -128 <= s.kind <= 127 else 0)
        c_start.append(_clamp(s.start_ns))
        c_end.append(_clamp(s.end_ns))
        c_code.append(s.status_code if -128 <= s.status_code <= 127 else 0)
        c_message.append(message)
        c_resource.append(rid)
        c_scope.append(sid)
        c_attrs.append(attributes)
        c_events.append(events)
        c_links.append(links)
        c_key.append(key_text)
        c_source.append(key[0] if key else None)
    columns["received_at"] = [received_at] * len(unique)
    return _span_rows(pa.table(columns, schema=SPANS_SCHEMA), resource_rows,
                      {sid: scope for scope, sid in scopes.items()})


def _span_rows(spans: pa.Table, resources: dict[int, tuple[str | None, str]],
               scopes: dict[int, tuple[str, str]]) -> SpanRows:
    """The spans with their resources (id -> service.name, attributes JSON) and scopes (id -> name, version)."""
    return SpanRows(
        spans,
        pa.table({"resource_id": list(resources), "service_name": [r[0] for r in resources.values()],
                  "attributes": [r[1] for r in resources.values()]}, schema=RESOURCES_SCHEMA),
        pa.table({"scope_id": list(scopes), "name": [s[0] for s in scopes.values()],
                  "version": [s[1] for s in scopes.values()]}, schema=SCOPES_SCHEMA))


def request_digest(table: pa.Table) -> bytes:
    """The request digest (`request_digest.ids_digest`) of a table's rows. In Python, not Arrow compute: importing
    pyarrow.compute would cost each decode worker 11 MB for a sort of a few hundred hex strings."""
    return ids_digest([key.encode() for key in map(operator.add, table.column("trace_id").to_pylist(),
                                                   table.column("span_id").to_pylist())])


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def columns_to_arrow(native: NativeColumns) -> SpanRows:
    """The C walk's column buffers as the rows `spans_to_arrow` builds (zero-copy over the buffers); each row's
    resource and scope index, into the request's resources and scopes, becomes their content id."""
    rows, arrays = native.rows, {}
    fixed = dict(zip(FIXED_COLUMNS, native.fixed, strict=True))
    for name in ("kind", "start_ns", "end_ns", "status_code"):
        arrays[name] = pa.Array.from_buffers(SPANS_SCHEMA.field(name).type, rows, [None, pa.py_buffer(fixed[name])])
    for name, (offsets, data, validity, nulls) in zip(STRING_COLUMNS, native.strings, strict=True):
        kind = SPANS_SCHEMA.field(name).type
        storage = pa.Array.from_buffers(
            pa.string(), rows, [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
                                pa.py_buffer(data)], null_count=nulls)
        arrays[name] = pa.ExtensionArray.from_storage(kind, storage) if isinstance(kind, pa.BaseExtensionType) \
            else storage
    resource_ids = [resource_id(attributes) for attributes, _ in native.resources]
    scope_ids = [scope_id(name, version) for name, version in native.scopes]
    for name, ids, index in (("resource_id", resource_ids, "resource_index"), ("scope_id", scope_ids, "scope_index")):
        arrays[name] = pa.array(ids, pa.int64()).take(
            pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(fixed[index])]))
    arrays["received_at"] = pa.Array.from_buffers(SPANS_SCHEMA.field("received_at").type, rows,
                                                  [None, pa.py_buffer(array("q", [native.received_us]) * rows)])
    return _span_rows(
        pa.table([arrays[name] for name in SPANS_SCHEMA.names], schema=SPANS_SCHEMA),
        {rid: (None if service is None else service.decode(), attributes.decode())
         for rid, (attributes, service) in zip(resource_ids, native.resources, strict=True)},
        {sid: (name.decode(), version.decode()) for sid, (name, version) in zip(scope_ids, native.scopes, strict=True)})


def decode_to_arrow(payload: bytes, content_type: str, redactor: Redactor | None, signal: str,
                    limits: tuple[int, ...], received_us: int) -> tuple[SpanRows, list[SpanProblem], int]:
    """The Python decoder's rows of a request (`decode_worker` falls back to it), its problems and cut spans."""
    span_limits = SpanLimits(*limits)
    decoded = decode_otlp(payload, content_type, span_limits) if signal == "traces" else \
        decode_otlp_logs(payload, content_type)
    spans = redactor.spans(decoded.spans) if redactor is not None else decoded.spans
    received_at = _EPOCH + timedelta(microseconds=received_us)
    return spans_to_arrow(spans, received_at, span_limits.request_row_bytes), decoded.problems, decoded.truncated


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_to_ipc(payload: bytes, content_type: str, redactor: Redactor | None, signal: str, limits: tuple[int, ...],
                  received_us: int) -> tuple[tuple[bytes, bytes, bytes], int, list[SpanProblem], int, bytes]:
    """`decode_to_arrow` as a decode worker answers: the three tables as Arrow IPC bytes, and the request digest."""
    rows, problems, truncated = decode_to_arrow(payload, content_type, redactor, signal, limits, received_us)
    return ((_ipc(rows.spans), _ipc(rows.resources), _ipc(rows.scopes)), rows.num_rows, problems, truncated,
            request_digest(rows.spans))


def rows_from_ipc(streams: tuple[bytes, bytes, bytes]) -> SpanRows:
    """A decode worker's `decode_to_ipc` tables, read back in the server."""
    spans, resources, scopes = (pa.ipc.open_stream(stream).read_all() for stream in streams)
    return SpanRows(spans, resources, scopes)
