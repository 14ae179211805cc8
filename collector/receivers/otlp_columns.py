"""OTLP protobuf trace requests straight to the spans table's column buffers, without a Python object per span.

The C walk (`_otlp_columns.c`, built with the package) decodes the requests that need nothing but decoding:
valid spans within the span limits and attribute values that are scalars or arrays of them. For anything else,
or where the extension was not built, `native_columns` answers None and the Python decoder (mapping.otlp, then
span_rows.spans_to_arrow), which defines what every row holds, decodes the request. Set
`TRACEJUDGE_NATIVE_DECODE=0` to decode every request in Python.

This module imports neither pyarrow nor the Python decoder: a decode worker that only ever meets such requests
stays about 35 MB smaller. The server turns the buffers into Arrow (`span_rows.columns_to_arrow`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from tracejudge.mapping.content_types import PROTOBUF_TYPES, media_type
from tracejudge.mapping.conversation_key import KEY_PRECEDENCE

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

try:
    from tracejudge.collector.receivers import _otlp_columns
except ImportError:  # no C compiler where the package was installed: every request is decoded in Python
    _otlp_columns = None  # type: ignore[assignment]

_PRECEDENCE = tuple(key.encode() for key in KEY_PRECEDENCE)
# resource_index and scope_index: int32, each row's place in `NativeColumns.resources` and `.scopes`
FIXED_COLUMNS = ("kind", "start_ns", "end_ns", "status_code", "resource_index", "scope_index")
STRING_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "status_message", "attributes", "events", "links",
                  "conversation_key", "conversation_key_source")


@dataclass(frozen=True)
class NativeColumns:
    """The buffers of a request's rows: little-endian fixed-width values, and per string column its int32
    offsets, UTF-8 data, validity bitmap (None: no nulls) and null count, each a buffer the walk's memory is
    handed over in without a copy (bytes once pickled); and the request's resources (attributes
    JSON, service.name) and scopes (name, version), one per ResourceSpans and ScopeSpans, which the rows point to.
    Plain bytes: it pickles cheaply."""

    rows: int
    received_us: int  # when the worker took the request, as the Python decoder stamps its rows
    fixed: tuple[Buffer, ...]
    strings: tuple[tuple[Buffer, Buffer, Buffer | None, int], ...]
    resources: tuple[tuple[bytes, bytes | None], ...]
    scopes: tuple[tuple[bytes, bytes], ...]

    def ids(self) -> list[bytes]:
        """Each row's trace id and span id, hex, as `span_rows.request_digest` reads them."""
        traces, spans = bytes(self.strings[0][1]), bytes(self.strings[1][1])
        return [traces[32 * i:32 * i + 32] + spans[16 * i:16 * i + 16] for i in range(self.rows)]


def native_decode_built() -> bool:
    """Whether `pip install` compiled the C walk (it needs a C compiler and Python's headers)."""
    return _otlp_columns is not None


def native_decode_enabled() -> bool:
    """Whether the C walk is built and not turned off by `TRACEJUDGE_NATIVE_DECODE=0`."""
    return native_decode_built() and os.environ.get("TRACEJUDGE_NATIVE_DECODE", "1") != "0"


def native_columns(payload: bytes, content_type: str, limits: tuple[int, ...],
                   received_us: int) -> NativeColumns | None:
    """The request's rows as column buffers, or None when Python must decode it. `limits`: SpanLimits as a tuple
    (`dataclasses.astuple`)."""
    if not native_decode_enabled() or media_type(content_type) not in PROTOBUF_TYPES:
        return None
    attribute_count, value_length, event_count, link_count, event_attribute_count, _, row_bytes = limits[:7]
    out = _otlp_columns.columns(payload, _PRECEDENCE, attribute_count, value_length, event_count, link_count,
                                event_attribute_count, row_bytes, orjson.dumps)
    if out is None:
        return None
    rows, fixed, strings, resources, scopes = out
    return NativeColumns(rows, received_us, tuple(fixed), tuple(strings), tuple(resources), tuple(scopes))
