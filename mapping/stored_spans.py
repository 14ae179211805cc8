"""Spans from the rows a span store keeps: ids, names and times as columns, attributes, events and links as JSON
text, the scope and resource by id. The collector reads the rows; this makes them the spans every dialect reads.
Compiled with the rest of the mapping (setup.py): a conversation makes one span per stored row."""

from __future__ import annotations

import json
from typing import Any

import orjson

from tracejudge.mapping.spans import Span, SpanEvent, SpanLink

# the columns of a stored row, in this order; `received_us` is when the span was received, in µs since the epoch
STORED_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
                  "status_message", "scope_id", "resource_id", "attributes", "events", "links", "received_us")
Scopes = dict[int, tuple[str, str]]  # scope id -> (name, version)
Resources = dict[int, dict[str, Any]]  # resource id -> its attributes
_NO_SCOPE = ("", "")


def stored_json(text: str) -> Any:
    """A span's attributes, events or links as the span writer stored them, read by orjson (a fifth of the standard
    library's time on a span's attributes): the writer's text holds only OTLP's values, integers within 64 bits
    among them, which orjson reads as the standard library does (past 64 bits it would read a float). Text orjson
    refuses goes to the standard library, which reads what it can."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _events(text: str) -> list[SpanEvent]:
    """Events as stored: most spans have none, and parsing "[]" for each of them added up."""
    if text == "[]":
        return []
    return [SpanEvent(e.get("name") or "", int(e.get("time_ns") or 0), e.get("attributes") or {})
            for e in stored_json(text) or ()]


def _links(text: str) -> list[SpanLink]:
    if text == "[]":
        return []
    return [SpanLink(lk["trace_id"], lk["span_id"], lk.get("attributes") or {}) for lk in stored_json(text) or ()]


def latest_copies(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A trace's stored rows with a span stored twice (sent again inside another request) counted once, as its
    copy received last. Done as the trace is mapped, not in the store's read (a window function over every span
    read was a third of the read's CPU): nearly every trace has no copy to drop."""
    if len({row[1] for row in rows}) == len(rows):
        return rows
    latest: dict[str, tuple[Any, ...]] = {}
    for row in rows:
        kept = latest.get(row[1])
        if kept is None or row[14] >= kept[14]:
            latest[row[1]] = row
    return list(latest.values())


def stored_spans(rows: list[tuple[Any, ...]], scopes: Scopes, resources: Resources) -> list[Span]:
    """The spans of these rows (`STORED_COLUMNS`). Spans of one resource share its parsed attributes, as those of
    one ResourceSpans do when decoded; a column the store left NULL is its field's empty value."""
    spans = []
    for r in rows:
        scope = scopes.get(r[9], _NO_SCOPE)
        spans.append(Span(r[0], r[1], r[2], r[3] or "", r[4] or 0, r[5] or 0, r[6] or 0, r[7] or 0, r[8] or "",
                          stored_json(r[11]) or {}, _events(r[12]), _links(r[13]), resources.get(r[10], {}),
                          scope[0], scope[1]))
    return spans
