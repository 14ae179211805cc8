"""OTLP spans to conversations to test cases: pure functions, no I/O.

`decode_otlp` turns an export request into normalized spans (reporting invalid spans one by one);
`build_conversations` groups spans into conversations and rebuilds each as a ConversationalTestCase (`map_traces`
maps each trace on its own and `compose_conversation` puts a conversation together from its mapped traces).
The names are imported on first use (PEP 562): decoding alone does not load the test-case models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mapping.conversation import (
        Conversation,
        MappedTrace,
        build_conversations,
        compose_conversation,
        map_traces,
    )
    from mapping.otlp import DecodedRequest, OTLPDecodeError, SpanProblem, UnsupportedContentTypeError, decode_otlp
    from mapping.otlp_logs import decode_otlp_logs
    from mapping.spans import Span, SpanEvent, SpanLink

_WHERE = {
    "Conversation": "mapping.conversation", "build_conversations": "mapping.conversation",
    "MappedTrace": "mapping.conversation", "compose_conversation": "mapping.conversation",
    "map_traces": "mapping.conversation",
    "DecodedRequest": "mapping.otlp", "OTLPDecodeError": "mapping.otlp", "SpanProblem": "mapping.otlp",
    "UnsupportedContentTypeError": "mapping.otlp", "decode_otlp": "mapping.otlp",
    "decode_otlp_logs": "mapping.otlp_logs",
    "Span": "mapping.spans", "SpanEvent": "mapping.spans", "SpanLink": "mapping.spans",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mapping' has no attribute {name!r}")


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
