"""Which conversation a trace belongs to: the first key present wins (semconv.md section 7, rule 2)."""

from __future__ import annotations

from collections.abc import Sequence

from tracejudge.mapping.spans import Span

KEY_PRECEDENCE = (
    "gen_ai.conversation.id",
    "session.id",
    "traceloop.association.properties.session_id",
    "gcp.vertex.agent.session_id",
    "langsmith.trace.session_id",
    "ai.settings.context.sessionId",  # Vercel AI SDK 7 (runtimeContext: {sessionId})
    "ai.telemetry.metadata.sessionId",  # Vercel AI SDK <= 6 (experimental_telemetry.metadata)
    "mcp.session.id",
)
TRACE_KEY = "trace_id"


def trace_conversation_key(spans: Sequence[Span]) -> tuple[str, str]:
    """(key name, value) for the spans of one trace, looking at spans (roots first), then resources."""
    ordered = sorted(spans, key=lambda s: (s.parent_span_id is not None, s.start_ns))
    for key in KEY_PRECEDENCE:
        for span in ordered:
            value = span.str_attr(key)
            if value:
                return key, value
        for span in ordered:
            value = span.resource.get(key)
            if isinstance(value, str) and value:
                return key, value
    return TRACE_KEY, ordered[0].trace_id


def span_own_conversation_key(span: Span) -> tuple[str, str] | None:
    """(key name, value) from the span's own attributes; None when it has none."""
    attributes = span.attributes
    for key in KEY_PRECEDENCE:
        value = attributes.get(key)
        if value is not None and value != "":
            return key, str(value)
    return None


def resource_conversation_key(resource: dict[str, object]) -> tuple[str, str] | None:
    for key in KEY_PRECEDENCE:
        value = resource.get(key)
        if isinstance(value, str) and value:
            return key, value
    return None


def span_conversation_key(span: Span) -> tuple[str, str] | None:
    """(key name, value) from the span's own attributes, then its resource; None when neither has one."""
    return span_own_conversation_key(span) or resource_conversation_key(span.resource)
