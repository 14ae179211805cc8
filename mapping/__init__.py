"""OTLP spans to conversations to test cases: pure functions, no I/O.

`decode_otlp` turns an export request into normalized spans (reporting invalid spans one by one);
`build_conversations` groups spans into conversations and rebuilds each as a ConversationalTestCase (`map_traces`
maps each trace on its own and `compose_conversation` puts a conversation together from its mapped traces).
The names are imported on first use (PEP 562): decoding alone does not load the test-case models. The hot modules
are compiled at install where a C compiler is (`compiled.py` says whether they run so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracejudge.lazy_names import lazy_getattr
from tracejudge.mapping.compiled import prefer_fresh_sources

if TYPE_CHECKING:
    from tracejudge.mapping.conversation import (
        Conversation,
        MappedTrace,
        build_conversations,
        compose_conversation,
        map_traces,
    )
    from tracejudge.mapping.otlp import (
        DecodedRequest,
        OTLPDecodeError,
        SpanProblem,
        UnsupportedContentTypeError,
        decode_otlp,
    )
    from tracejudge.mapping.otlp_logs import decode_otlp_logs
    from tracejudge.mapping.spans import Span, SpanEvent, SpanLink

_NAMES = {
    "tracejudge.mapping.conversation": (
        "Conversation", "MappedTrace", "build_conversations", "compose_conversation", "map_traces"),
    "tracejudge.mapping.otlp": (
        "DecodedRequest", "OTLPDecodeError", "SpanProblem", "UnsupportedContentTypeError", "decode_otlp"),
    "tracejudge.mapping.otlp_logs": ("decode_otlp_logs",),
    "tracejudge.mapping.spans": ("Span", "SpanEvent", "SpanLink"),
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}
prefer_fresh_sources()  # before any compiled module is imported: a checkout's edited source, not its stale build


__getattr__ = lazy_getattr(globals(), _WHERE)

__all__ = [
    "Conversation",
    "DecodedRequest",
    "MappedTrace",
    "OTLPDecodeError",
    "Span",
    "SpanEvent",
    "SpanLink",
    "SpanProblem",
    "UnsupportedContentTypeError",
    "build_conversations",
    "compose_conversation",
    "decode_otlp",
    "decode_otlp_logs",
    "map_traces",
]
