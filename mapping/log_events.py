"""Log-event carrier spans folded back into the spans they name, before a conversation is built.

A GenAI event sent as an OTLP log record is stored as a *carrier span* (`otlp_logs`): a child of the span the
record names, in scope `tracejudge.log_event`, holding the record as its one event. Kept apart from the decoder, so
the mapping reads carriers without loading the protobuf classes (an assembly worker never decodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tracejudge.mapping.spans import Span, SpanEvent

LOG_EVENT_SCOPE = "tracejudge.log_event"


def fold_log_events(spans: Iterable[Span]) -> list[Span]:
    """Spans with the events their carriers hold put back on them; carriers whose span has not arrived wait
    out of the conversation (they join it when the span comes)."""
    spans = spans if isinstance(spans, list) else list(spans)
    if not any(span.scope_name == LOG_EVENT_SCOPE for span in spans):
        return spans
    plain: dict[tuple[str, str], Span] = {}
    carried: dict[tuple[str, str], list[SpanEvent]] = {}
    for span in spans:
        if span.scope_name == LOG_EVENT_SCOPE and span.parent_span_id:
            carried.setdefault((span.trace_id, span.parent_span_id), []).extend(span.events)
        else:
            plain[span.key] = span
    if not carried:
        return list(plain.values())
    for key, events in carried.items():
        span = plain.get(key)
        if span is not None:
            plain[key] = replace(span, events=sorted([*span.events, *events], key=lambda e: e.time_ns), _parsed={})
    return list(plain.values())
