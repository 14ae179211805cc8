"""Property-based: decode and mapping never raise on arbitrary input, and every result is a valid test case."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures import semconv_scenarios
from tracejudge.mapping import OTLPDecodeError, build_conversations, compose_conversation, decode_otlp, map_traces
from tracejudge.mapping.spans import Span, parse_json_value
from tracejudge.test_case import ConversationalTestCase

KEYS = ["gen_ai.operation.name", "gen_ai.conversation.id", "gen_ai.input.messages", "gen_ai.output.messages",
        "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
        "mcp.method.name", "mcp.resource.uri", "gen_ai.prompt.name", "openinference.span.kind", "input.value",
        "output.value", "tool.name", "llm.input_messages.0.message.role", "llm.input_messages.0.message.content",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id", "traceloop.span.kind",
        "traceloop.entity.input", "traceloop.entity.output", "gen_ai.prompt.0.role", "gen_ai.completion.0.content",
        "pydantic_ai.all_messages", "pydantic_ai.new_message_index", "gcp.vertex.agent.tool_call_args",
        "gcp.vertex.agent.llm_request", "session.id", "error.type", "gen_ai.tool.definitions"]
# Every key the mapping reads, from span attributes or from the JSON in them (read from its source, so a key a dialect
# starts reading is fuzzed too): arbitrary values must reach every typed slot, which the compiled mapping checks.
_READS = re.compile(r'(?:attr|str_attr|json_attr|genai_json|get)\(\s*"([^"]+)"')
_MAPPING = Path(__file__).resolve().parent.parent / "mapping"
READ_KEYS = sorted({key for path in [*_MAPPING.glob("*.py"), *_MAPPING.glob("dialects/*.py")]
                    for key in _READS.findall(path.read_text())})
KEYS += [k for k in READ_KEYS if "." in k and k not in KEYS]
JSON_KEYS = sorted({"role", "parts", "type", "content", "id", "name", "arguments", "response", "result", "tool_calls",
                    "text", "isError", "structuredContent", "contents", "messages", "tools", "args", "kwargs",
                    *(k for k in READ_KEYS if "." not in k)})
VALUES = {
    "gen_ai.operation.name": st.sampled_from(["invoke_agent", "chat", "execute_tool", "weird"]),
    "mcp.method.name": st.sampled_from(["tools/call", "resources/read", "prompts/get", "tools/list", "ping"]),
    "openinference.span.kind": st.sampled_from(["AGENT", "LLM", "TOOL", "CHAIN", "UNKNOWN"]),
    "traceloop.span.kind": st.sampled_from(["workflow", "tool", "agent", "task"]),
}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(JSON_KEYS), inner, max_size=5),
    max_leaves=20,
)
attribute_value = json_values | json_values.map(lambda v: json.dumps(v, default=str)) | st.text(max_size=40)


@st.composite
def span_forest(draw: Any) -> list[Span]:
    count = draw(st.integers(1, 25))
    traces = [f"{draw(st.integers(1, 3)):032x}" for _ in range(count)]
    spans = []
    for i in range(count):
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=8, unique=True))
        attributes = {k: draw(VALUES.get(k, attribute_value)) for k in keys}
        parent = draw(st.none() | st.integers(1, count + 2))  # dangling and cyclic parents included
        spans.append(Span(trace_id=traces[i], span_id=f"{i + 1:016x}",
                          parent_span_id=None if parent is None else f"{parent:016x}",
                          name=draw(st.sampled_from(["invoke_agent a", "chat m", "execute_tool t", "tools/call t",
                                                     "MCP send tools/call t", "x.tool", "tools/list.mcp", "?"])),
                          kind=draw(st.integers(0, 5)), start_ns=draw(st.integers(0, 10**12)),
                          end_ns=draw(st.integers(0, 10**12)), status_code=draw(st.integers(0, 2)),
                          attributes=attributes, resource=draw(st.sampled_from([{}, {"service.name": "svc"}]))))
    return spans


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(span_forest())
def test_mapping_never_raises_and_always_gives_valid_test_cases(spans: list[Span]) -> None:
    for conversation in build_conversations(spans):
        dumped = conversation.test_case.model_dump(mode="json")  # what the collector stores
        assert ConversationalTestCase.model_validate(dumped).model_dump(mode="json") == dumped
        assert conversation.test_case.turns


def _summary(conversation: Any) -> tuple[Any, ...]:
    return (conversation.conversation_id, conversation.key, conversation.content_hash, conversation.trace_ids,
            conversation.first_span_ns, conversation.last_span_ns, conversation.service_name,
            conversation.agent_name, conversation.test_case.model_dump_json())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(span_forest(), st.randoms(use_true_random=False))
def test_conversations_composed_from_traces_mapped_one_at_a_time_are_the_ones_mapped_whole(
        spans: list[Span], rng: random.Random) -> None:
    """What incremental assembly relies on: the collector maps a new trace alone and composes the conversation from
    it and its earlier traces' mapped parts, kept from before; that must be the conversation mapping all of its
    spans at once gives, whatever order the parts come in, and composing must not change the parts."""
    whole = [_summary(c) for c in build_conversations(spans)]
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    mapped = [m for trace_spans in by_trace.values() for m in map_traces(trace_spans)]
    groups: dict[str, list[Any]] = {}
    for trace in mapped:
        groups.setdefault(trace.conversation_id, []).append(trace)
    for _ in range(2):
        parts = []
        for group in groups.values():
            rng.shuffle(group)
            conversation = compose_conversation(group)
            if conversation is not None:
                parts.append(conversation)
        assert [_summary(c) for c in sorted(parts, key=lambda c: (c.first_span_ns, c.conversation_id))] == whole


def _mutate(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            roll = rng.random()
            if roll < 0.05:
                continue  # drop a key
            out[k] = rng.choice([None, 5, "x", [], {}, -1, 1e400, "0" * 40]) if roll < 0.12 else _mutate(v, rng)
        return out
    if isinstance(value, list):
        return [_mutate(v, rng) for v in value if rng.random() > 0.05]
    return value


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
def test_mutated_otlp_json_is_decoded_or_refused_precisely(seed: int) -> None:
    rng = random.Random(seed)
    body = _mutate(semconv_scenarios.otel_genai(), rng)
    try:
        decoded = decode_otlp(json.dumps(body), "application/json")
    except OTLPDecodeError:
        return
    build_conversations(decoded.spans)  # whatever survived decoding maps without raising


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_are_refused_precisely(payload: bytes) -> None:
    for content_type in ("application/x-protobuf", "application/json"):
        try:
            decoded = decode_otlp(payload, content_type)
        except OTLPDecodeError:
            continue
        build_conversations(decoded.spans)


wide_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80) | st.floats(allow_nan=True)
    | st.text(max_size=20) | st.sampled_from(["\ud800", "a\udfffb"]),  # lone surrogates, as JSON escapes give them
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6) | st.just("\ud800"), inner,
                                                                max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(wide_values)
def test_attribute_json_is_strict_and_says_what_the_standard_library_path_says(value: Any) -> None:
    """Span attributes go to DuckDB as JSON without a re-parse, so `to_json` must always write strict JSON; its
    fast path (orjson) must mean what the standard library writes; and the path for what orjson cannot write must
    write the text orjson writes wherever orjson can, so equal values are equal text (as the C walk writes them)."""
    from tracejudge.collector.receivers.span_rows import _finite, _scrub, _written, to_json

    text = to_json(value)
    parsed = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c} in {text}"))
    assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)
    clean = _scrub(_finite(value))
    assert parsed == json.loads(json.dumps(clean, allow_nan=False, ensure_ascii=False, default=str))
    try:
        orjson_text = orjson.dumps(clean, default=str).decode()
    except (orjson.JSONEncodeError, TypeError):  # ints past 64 bits, nesting past orjson's depth
        return
    assert _written(clean) == orjson_text


plain_json = st.recursive(  # JSON values equal to themselves once parsed (no NaN)
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15)
whitespace = st.text(alphabet=" \t\r\n", max_size=3)


@settings(max_examples=300, deadline=None)
@given(plain_json, whitespace, whitespace)
def test_a_json_attribute_value_reads_as_the_json_it_holds(value: Any, before: str, after: str) -> None:
    """Messages, arguments and results arrive as JSON text: an object, list or string is read as json.loads reads
    it, whitespace around it or not."""
    text = before + json.dumps(value) + after
    if text.strip()[:1] in ("{", "[", '"'):
        assert parse_json_value(text) == value


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=40), st.builds(lambda v, tail: json.dumps(v) + tail, plain_json,
                                                  st.text(max_size=5))))
def test_text_that_is_not_json_is_kept_as_it_was(text: str) -> None:
    """Text json.loads refuses (a truncated message, JSON with more after it, prose) is the value itself."""
    try:
        json.loads(text.strip())
    except (ValueError, RecursionError):
        assert parse_json_value(text) == text
