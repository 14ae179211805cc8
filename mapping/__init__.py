"""OTLP spans to conversations to test cases: pure functions, no I/O.

`decode_otlp` turns an export request into normalized spans (reporting invalid spans one by one);
`build_conversations` groups spans into conversations and rebuilds each as a ConversationalTestCase.
"""

from mapping.conversation import Conversation, build_conversations
from mapping.otlp import DecodedRequest, OTLPDecodeError, SpanProblem, UnsupportedContentTypeError, decode_otlp
from mapping.spans import Span, SpanEvent, SpanLink

__all__ = [
    "Conversation",
    "DecodedRequest",
    "OTLPDecodeError",
    "Span",
    "SpanEvent",
    "SpanLink",
    "SpanProblem",
    "UnsupportedContentTypeError",
    "build_conversations",
    "decode_otlp",
]
