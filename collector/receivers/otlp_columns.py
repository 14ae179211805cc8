"""OTLP protobuf trace requests straight to the spans table's Arrow columns, without a Python object per span.

The C walk (`_otlp_columns.c`, built with the package) decodes the requests that need nothing but decoding:
valid spans within the span limits and attribute values that are scalars or arrays of them. For anything else,
or where the extension was not built, `protobuf_table` answers None and the Python decoder (mapping.otlp, then
span_rows.spans_to_arrow), which defines what every row holds, decodes the request. Set
`TRACEJUDGE_NATIVE_DECODE=0` to decode every request in Python.
"""

from __future__ import annotations

import os
from array import array
from datetime import UTC, datetime, timedelta

import orjson
import pyarrow as pa

from collector.receivers.span_rows import SPANS_SCHEMA
from mapping.conversation_key import KEY_PRECEDENCE
from mapping.otlp import PROTOBUF_TYPES, SpanLimits

try:
    from collector.receivers import _otlp_columns
except ImportError:  # no C compiler where the package was installed: every request is decoded in Python
    _otlp_columns = None  # type: ignore[assignment]

_PRECEDENCE = tuple(key.encode() for key in KEY_PRECEDENCE)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIXED = ("kind", "start_ns", "end_ns", "status_code")
_STRINGS = ("trace_id", "span_id", "parent_span_id", "name", "status_message", "service_name", "scope_name",
            "scope_version", "attributes", "resource_attributes", "events", "links", "conversation_key",
            "conversation_key_source")


def native_decode_enabled() -> bool:
    """Whether the C walk is built and not turned off by `TRACEJUDGE_NATIVE_DECODE=0`."""
    return _otlp_columns is not None and os.environ.get("TRACEJUDGE_NATIVE_DECODE", "1") != "0"


def protobuf_table(payload: bytes, content_type: str, limits: SpanLimits, received_at: datetime) -> pa.Table | None:
    """The request's rows (as `spans_to_arrow` would build them), or None when Python must decode it."""
    if not native_decode_enabled() or content_type.split(";", 1)[0].strip().lower() not in PROTOBUF_TYPES:
        return None
    out = _otlp_columns.columns(payload, _PRECEDENCE, limits.attribute_count, limits.attribute_value_length,
                                limits.event_count, limits.link_count, limits.event_attribute_count, orjson.dumps)
    if out is None:
        return None
    rows, fixed, strings = out
    arrays: dict[str, pa.Array] = {}
    for name, data in zip(_FIXED, fixed, strict=True):
        arrays[name] = pa.Array.from_buffers(SPANS_SCHEMA.field(name).type, rows, [None, pa.py_buffer(data)])
    for name, (offsets, data, validity, nulls) in zip(_STRINGS, strings, strict=True):
        kind = SPANS_SCHEMA.field(name).type
        storage = pa.Array.from_buffers(
            pa.string(), rows, [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
                                pa.py_buffer(data)], null_count=nulls)
        arrays[name] = pa.ExtensionArray.from_storage(kind, storage) if isinstance(kind, pa.BaseExtensionType) \
            else storage
    received = SPANS_SCHEMA.field("received_at").type
    micros = (received_at - _EPOCH) // timedelta(microseconds=1)
    arrays["received_at"] = pa.Array.from_buffers(received, rows, [None, pa.py_buffer(array("q", [micros]) * rows)])
    return pa.table([arrays[name] for name in SPANS_SCHEMA.names], schema=SPANS_SCHEMA)
