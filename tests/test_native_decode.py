"""The C walk from OTLP protobuf to Arrow columns writes exactly the rows the Python decoder writes, or leaves the
request to it; no request, however malformed, makes it crash or keep a span the Python decoder would refuse."""

from __future__ import annotations

import os
import pickle
import random
import struct
import subprocess
import sys
from dataclasses import astuple, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from bench.ingest import build_requests
from tests.support.collector_process import CollectorProcess
from tracejudge.collector.receivers.decode_worker import decode_request
from tracejudge.collector.receivers.otlp_columns import native_columns, native_decode_enabled
from tracejudge.collector.receivers.span_rows import columns_to_arrow, request_digest, rows_from_ipc, spans_to_arrow
from tracejudge.collector.store.span_tables import SpanRows
from tracejudge.mapping.conversation_key import KEY_PRECEDENCE
from tracejudge.mapping.otlp import DEFAULT_LIMITS, OTLPDecodeError, SpanLimits, decode_otlp

PROTOBUF = "application/x-protobuf"
ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 12, 4, 12, 0, 0, 123456, tzinfo=UTC)
NOW_US = (NOW - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
SMALL_LIMITS = SpanLimits(attribute_count=3, attribute_value_length=8, event_count=2, link_count=1,
                          event_attribute_count=2)


def _python_rows(payload: bytes, limits: SpanLimits) -> tuple[SpanRows, int, int] | None:
    """The Python decoder's rows, problems and truncated spans; None when it refuses the whole request."""
    try:
        decoded = decode_otlp(payload, PROTOBUF, limits)
        return spans_to_arrow(decoded.spans, NOW, limits.request_row_bytes), len(decoded.problems), decoded.truncated
    except OTLPDecodeError:
        return None


def _assert_same_rows(native: SpanRows, python: SpanRows) -> None:
    """The same tables, every value the same text: a user's SQL over the JSON columns sees the same strings."""
    for got, want in ((native.spans, python.spans), (native.resources, python.resources),
                      (native.scopes, python.scopes)):
        assert got.schema == want.schema
        assert got.num_rows == want.num_rows
        for name in want.schema.names:
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), (
                name, got.column(name)[:3], want.column(name)[:3])


def _native_rows(payload: bytes, limits: SpanLimits = DEFAULT_LIMITS) -> SpanRows | None:
    native = native_columns(payload, PROTOBUF, astuple(limits), NOW_US)
    return None if native is None else columns_to_arrow(native)


def _check(payload: bytes, limits: SpanLimits = DEFAULT_LIMITS) -> SpanRows | None:
    """The property itself: the C walk's rows are the Python decoder's, for a request it decodes whole."""
    native = _native_rows(payload, limits)
    python = _python_rows(payload, limits)
    if native is None:
        return None
    assert python is not None, "the C walk kept spans of a request the Python decoder refuses"
    rows, problems, truncated = python
    assert (problems, truncated) == (0, 0), "the C walk kept a request with problems or cut spans"
    _assert_same_rows(native, rows)
    return native


def _kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def _agent_request() -> bytes:
    """What an instrumented MCP agent sends: GenAI and MCP attributes, arrays, doubles, events and links."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend([_kv("service.name", AnyValue(string_value="weather-agent")),
                                   _kv("session.id", AnyValue(string_value="chat-7")),
                                   _kv("host.cores", AnyValue(int_value=2))])
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "opentelemetry.instrumentation.mcp", "0.40.0"
    chat = ss.spans.add(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="chat gpt-4.1", kind=3,
                        start_time_unix_nano=1_767_225_600_000_000_000, end_time_unix_nano=1_767_225_601_000_000_000)
    chat.attributes.extend([
        _kv("gen_ai.request.temperature", AnyValue(double_value=0.7)),
        _kv("gen_ai.request.top_p", AnyValue(double_value=1e-05)),
        _kv("gen_ai.usage.input_tokens", AnyValue(int_value=-(2**63))),
        _kv("gen_ai.response.finish_reasons", AnyValue(array_value={"values": [AnyValue(string_value="stop"),
                                                                               AnyValue(bool_value=True)]})),
        _kv("gen_ai.input.messages", AnyValue(string_value='[{"role":"user","content":"Wetter in Zürich?\\n"}]')),
        _kv("control", AnyValue(string_value="tab\there \x00 \x1f \x7f \u2028 \"quoted\" back\\slash é 漢字 🙂")),
        _kv("empty", AnyValue(string_value="")),
        _kv("unset", AnyValue()),
        _kv("gen_ai.conversation.id", AnyValue(string_value="conv-1")),
    ])
    chat.events.add(time_unix_nano=2**64 - 1, name="gen_ai.choice").attributes.extend(
        [_kv("index", AnyValue(int_value=0))])
    chat.links.add(trace_id=b"\x07" * 16, span_id=b"\x08" * 8).attributes.extend(
        [_kv("why", AnyValue(string_value="follows"))])
    chat.status.code, chat.status.message = 2, "rate limited"
    tool = ss.spans.add(trace_id=bytes(range(1, 17)), span_id=bytes(range(2, 10)), parent_span_id=bytes(range(1, 9)),
                        name="tools/call get-weather", kind=-5, start_time_unix_nano=5, end_time_unix_nano=2**63 - 1)
    tool.attributes.extend([_kv("mcp.method.name", AnyValue(string_value="tools/call"))])
    ss.spans.add(trace_id=b"\x0d" * 16, span_id=b"\x0e" * 8, name="many attributes").attributes.extend(
        [_kv(f"k{i}", AnyValue(int_value=i)) for i in range(50)])  # past the pairwise check: the hashed one
    ss.spans.add(trace_id=b"\x09" * 16, span_id=b"\x0a" * 8, parent_span_id=bytes(8), name="zero parent", kind=200)
    request.resource_spans.add().scope_spans.add().spans.add(trace_id=b"\x0b" * 16, span_id=b"\x0c" * 8, name="bare")
    return request.SerializeToString()


def test_the_extension_is_built_and_the_collector_says_which_decoder_it_runs(tmp_path: Path) -> None:
    assert native_decode_enabled(), "collector/receivers/_otlp_columns.c was not built: `pip install -e .` with gcc"
    cores = len(os.sched_getaffinity(0))
    for env, decoder, threads, workers in (({}, "c", cores, max(1, cores - 1)),
                                           ({"TRACEJUDGE_NATIVE_DECODE": "0"}, "python", 0, cores)):
        with CollectorProcess(tmp_path / f"{decoder}.duckdb", env=env) as collector:
            line = collector.start_line
            assert (line["decoder"], line["decode_threads"], line["decode_workers"]) == (decoder, threads, workers)


@pytest.mark.parametrize("payload", [pytest.param(_agent_request(), id="agent"),
                                     pytest.param(build_requests(1, 512)[0], id="bench"),
                                     pytest.param(b"", id="empty")])
def test_agent_spans_are_decoded_in_c_into_the_python_decoders_rows(payload: bytes) -> None:
    table = _check(payload)
    assert table is not None, "the C walk left an ordinary request to Python"
    assert table.num_rows == len(decode_otlp(payload, PROTOBUF).spans)


def test_a_decode_worker_answers_as_the_python_decoder_would() -> None:
    """A worker's whole answer (rows, problems, cut spans, the digest redeliveries are recognised by) is the one
    the Python decoder gives, and a worker that only met such requests never imported it or pyarrow."""
    code = f"""if True:
        import pickle, sys
        from tracejudge.collector.receivers.decode_worker import decode_request
        answer = decode_request(sys.stdin.buffer.read(), "{PROTOBUF}", {astuple(DEFAULT_LIMITS)!r})
        print(sorted(m for m in ("pyarrow", "tracejudge.mapping.otlp", "duckdb") if m in sys.modules))
        sys.stdout.buffer.write(pickle.dumps(answer))
    """
    payload = _agent_request()
    run = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, check=True, cwd=ROOT)
    imported, _, answer = run.stdout.partition(b"\n")
    assert imported == b"[]", "a decode worker imported the Python decoder or pyarrow for a request it did not need"
    native, rows, problems, truncated, digest = pickle.loads(answer)
    python = spans_to_arrow(decode_otlp(payload, PROTOBUF).spans, NOW)
    assert (rows, problems, truncated, digest) == (python.num_rows, [], 0, request_digest(python.spans))
    assert [f.name for f in fields(SpanLimits)][:7] == [  # the order the C walk takes them in
        "attribute_count", "attribute_value_length", "event_count", "link_count", "event_attribute_count",
        "max_json_objects", "request_row_bytes"]


def test_a_request_left_to_python_is_answered_as_ipc_with_its_problems() -> None:
    payload = _span(trace_id=bytes(16)) + _span(span_id=b"\x05" * 8)
    data, rows, problems, truncated, digest = decode_request(payload, PROTOBUF, astuple(DEFAULT_LIMITS))
    assert isinstance(data, tuple) and rows == 1 and len(problems) == 1 and truncated == 0
    assert digest == request_digest(rows_from_ipc(data).spans)


def _span(**fields: Any) -> bytes:
    request = ExportTraceServiceRequest()
    base = {"trace_id": b"\x01" * 16, "span_id": b"\x02" * 8, "name": "s"}
    request.resource_spans.add().scope_spans.add().spans.add(**{**base, **fields})
    return request.SerializeToString()


@pytest.mark.parametrize("payload, limits", [
    pytest.param(_span(trace_id=bytes(16)), DEFAULT_LIMITS, id="zero trace id"),
    pytest.param(_span(span_id=b"\x01" * 7), DEFAULT_LIMITS, id="short span id"),
    pytest.param(_span(parent_span_id=b"\x01" * 3), DEFAULT_LIMITS, id="bad parent id"),
    pytest.param(_span(name=""), DEFAULT_LIMITS, id="no name"),
    pytest.param(_span(start_time_unix_nano=2**63), DEFAULT_LIMITS, id="after 2262"),
    pytest.param(_span(attributes=[_kv("a", AnyValue(string_value="x" * 9))]), SMALL_LIMITS, id="value cut"),
    pytest.param(_span(attributes=[_kv(k, AnyValue(int_value=1)) for k in "abcd"]), SMALL_LIMITS, id="count cut"),
    pytest.param(_span(attributes=[_kv("a", AnyValue(int_value=1)), _kv("a", AnyValue(int_value=2))]),
                 DEFAULT_LIMITS, id="duplicate key"),
    pytest.param(_span(attributes=[_kv(f"k{i % 40}", AnyValue(int_value=i)) for i in range(41)]), DEFAULT_LIMITS,
                 id="duplicate key among many"),
    pytest.param(_span(attributes=[_kv("a", AnyValue(double_value=float("nan")))]), DEFAULT_LIMITS, id="NaN"),
    pytest.param(_span(attributes=[_kv("a", AnyValue(bytes_value=b"\x00"))]), DEFAULT_LIMITS, id="bytes"),
    pytest.param(_span(attributes=[_kv("session.id", AnyValue(int_value=7))]), DEFAULT_LIMITS, id="numeric key"),
    pytest.param(_span() * 2, DEFAULT_LIMITS, id="span sent twice"),
    pytest.param(_span() + b"\xff", DEFAULT_LIMITS, id="truncated"),
])
def test_what_the_python_decoder_reports_or_cuts_is_left_to_it(payload: bytes, limits: SpanLimits) -> None:
    assert _native_rows(payload, limits) is None
    _check(payload, limits)


def _many_spans(resource: dict[str, str], scope: tuple[str, str] = ("", ""), spans: int = 1000) -> bytes:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(_kv(k, AnyValue(string_value=v)) for k, v in resource.items())
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = scope
    ss.spans.extend(PbSpan(trace_id=b"\x01" * 16, span_id=i.to_bytes(8, "big"), name="s") for i in range(1, spans + 1))
    return request.SerializeToString()


def test_a_large_resource_and_scope_on_many_small_spans_are_stored_once() -> None:
    """300 KiB of resource and 2 MB of scope on 1,000 spans were 2.3 GB of rows when every row carried them; each is
    now one row that every span refers to, decoded by the C walk as by the Python decoder."""
    payload = _many_spans({"service.name": "a", "host.notes": "x" * 300 * 1024}, ("n" * 2**20, "v" * 2**20))
    rows = _check(payload)
    assert rows is not None and rows.num_rows == 1000
    assert rows.resources.num_rows == rows.scopes.num_rows == 1
    assert set(rows.spans.column("resource_id").to_pylist()) == set(rows.resources.column("resource_id").to_pylist())
    assert rows.spans.nbytes < 200_000 and rows.resources.nbytes + rows.scopes.nbytes < 2 * 2**20 + 400_000


def test_a_scope_past_the_value_length_is_cut_and_reported_as_attributes_are() -> None:
    payload = _many_spans({}, ("a-very-long-scope-name", "1.2.3"), spans=3)
    assert _native_rows(payload, SMALL_LIMITS) is None  # the C walk leaves cutting to the Python decoder
    decoded = decode_otlp(payload, PROTOBUF, SMALL_LIMITS)
    assert decoded.truncated == 3
    assert {(s.scope_name, s.scope_version) for s in decoded.spans} == {("a-very-l", "1.2.3")}


def test_rows_past_the_request_row_bytes_are_refused_by_both_decoders_at_the_same_byte() -> None:
    """A resource's conversation key is on every row: 300 KiB of it on 1,000 spans is 300 MB, refused before it is
    built, with the limit named. Both decoders count the same bytes, so the same request is never kept by one and
    refused by the other: at exactly its size both keep it, one byte under both refuse it."""
    payload = _many_spans({"session.id": "k" * 300 * 1024})
    assert _native_rows(payload) is None
    with pytest.raises(OTLPDecodeError, match=r"request_row_bytes"):
        decode_request(payload, PROTOBUF, astuple(DEFAULT_LIMITS))
    small = _many_spans({"service.name": "é-agent", "session.id": "k" * 1000}, ("scope", "1"), spans=20)
    rows = _check(small)
    assert rows is not None
    size = sum(len(v.encode()) for table in (rows.spans, rows.resources, rows.scopes) for name in table.schema.names
               if pa.types.is_string(table.schema.field(name).type) or name == "attributes" or name == "events"
               or name == "links" for v in table.column(name).to_pylist() if isinstance(v, str))
    exact, under = (SpanLimits(request_row_bytes=n) for n in (size, size - 1))
    assert _check(small, exact) is not None
    assert _native_rows(small, under) is None and _python_rows(small, under) is None


def _varint(value: int, size: int) -> bytes:
    """`value` as a protobuf varint of exactly `size` bytes (padded with continuation bytes, as some encoders do)."""
    out = bytearray()
    for i in range(size):
        out.append((value >> (7 * i)) & 0x7F | (0x80 if i < size - 1 else 0))
    return bytes(out)


def _nested(field: int, payload: bytes) -> bytes:
    return _varint_min(field << 3 | 2) + _varint_min(len(payload)) + payload


def _varint_min(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


@pytest.mark.parametrize("size, decoded_in_c", [(5, True), (6, False)])
def test_tags_and_lengths_padded_past_five_bytes_are_left_to_python(size: int, decoded_in_c: bool) -> None:
    """protobuf's parser takes a padded tag or length of up to 5 bytes and rejects a longer one (the Python decoder
    then reports the span); the C walk must do the same, not keep the span."""
    tail = PbSpan(span_id=b"\x02" * 8, name="s").SerializeToString()
    for span in (_varint(1 << 3 | 2, size) + _varint_min(16) + b"\x01" * 16 + tail,  # a padded tag
                 PbSpan(trace_id=b"\x01" * 16).SerializeToString() + tail + _varint(15 << 3 | 2, 1)
                 + _varint(0, size)):  # a padded length (an empty status)
        payload = _nested(1, _nested(2, _nested(2, span)))
        assert (_check(payload) is not None) == decoded_in_c
        assert len(decode_otlp(payload, PROTOBUF).spans) == (1 if decoded_in_c else 0)


def _fnv1a(data: bytes) -> int:
    """The C walk's hash for its duplicate checks (unkeyed: a client can choose keys that collide)."""
    h = 1469598103934665603
    for byte in data:
        h = ((h ^ byte) * 1099511628211) % 2**64
    return h


def test_attribute_keys_chosen_to_collide_in_the_c_hash_are_left_to_python() -> None:
    """200 keys in one slot of the C walk's 512-slot set would cost it a quadratic walk per span: past 64 probes
    it leaves the request to the Python decoder, whose dicts hash with a per-process secret."""
    keys, n = [], 0
    while len(keys) < 200:
        key = f"k{n}".encode()
        n += 1
        if _fnv1a(key) % 512 == 0:
            keys.append(key.decode())
    payload = _span(attributes=[_kv(key, AnyValue(int_value=i)) for i, key in enumerate(keys)])
    assert _native_rows(payload) is None
    assert _check(payload) is None
    assert len(decode_otlp(payload, PROTOBUF).spans[0].attributes) == 200


# --- generated requests ---------------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
keys = st.sampled_from(["a", "b", "c", "d", "service.name", "session.id", "gen_ai.conversation.id", "mcp.session.id",
                        "é"])
native_scalars = st.one_of(
    texts.map(lambda t: AnyValue(string_value=t)), st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: AnyValue(double_value=f)), st.just(AnyValue()))
nested = st.recursive(native_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda vs: AnyValue(array_value={"values": vs})),
    st.lists(st.tuples(keys, inner), max_size=2).map(
        lambda kvs: AnyValue(kvlist_value={"values": [_kv(k, v) for k, v in kvs]}))), max_leaves=4)
# (what the C walk decodes, what it leaves to the Python decoder)
STRATEGIES: dict[str, tuple[st.SearchStrategy, st.SearchStrategy]] = {
    "name": (st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
             st.just("")),
    "id16": (st.binary(min_size=16, max_size=16).filter(any), st.sampled_from([bytes(16), b"\x01" * 15, b""])),
    "id8": (st.binary(min_size=8, max_size=8).filter(any), st.sampled_from([bytes(8), b"\x01" * 9, b""])),
    "time": (st.integers(0, 2**63 - 1), st.integers(2**63, 2**64 - 1)),
    "value": (st.one_of(native_scalars, st.lists(native_scalars, max_size=3).map(
        lambda vs: AnyValue(array_value={"values": vs}))), st.one_of(
        st.sampled_from([float("nan"), float("inf")]).map(lambda f: AnyValue(double_value=f)),
        st.binary(max_size=4).map(lambda b: AnyValue(bytes_value=b)), nested)),
}


def _pick(draw: Any, clean: bool, what: str) -> Any:
    """A clean request's values are all ones the C walk decodes (conversation keys are strings in it: others go
    through Python's `str`); another's are one in four of the other kind."""
    good, bad = STRATEGIES[what]
    return draw(good if clean or draw(st.integers(0, 3)) else bad)


def _attributes(draw: Any, clean: bool) -> list[KeyValue]:
    chosen = draw(st.lists(keys, max_size=5, unique=clean))
    return [_kv(key, AnyValue(string_value=draw(texts)) if clean and key in KEY_PRECEDENCE else
                _pick(draw, clean, "value")) for key in chosen]


def _drawn_span(draw: Any, clean: bool) -> PbSpan:
    parent = b"" if draw(st.booleans()) else _pick(draw, clean, "id8")
    span = PbSpan(trace_id=_pick(draw, clean, "id16"), span_id=_pick(draw, clean, "id8"), parent_span_id=parent,
                  name=_pick(draw, clean, "name"),
                  kind=draw(st.integers(-130, 130) | st.integers(-(2**31), 2**31 - 1)),
                  start_time_unix_nano=_pick(draw, clean, "time"), end_time_unix_nano=_pick(draw, clean, "time"),
                  attributes=_attributes(draw, clean))
    for _ in range(draw(st.integers(0, 2))):
        span.events.add(name=draw(texts), time_unix_nano=draw(st.integers(0, 2**64 - 1)),
                        attributes=_attributes(draw, clean))
    for _ in range(draw(st.integers(0, 1))):
        span.links.add(trace_id=draw(st.binary(max_size=17)), span_id=draw(st.binary(max_size=9)),
                       attributes=_attributes(draw, clean))
    if draw(st.booleans()):
        span.status.code, span.status.message = draw(st.integers(-130, 130)), draw(texts)
    return span


@st.composite
def requests(draw: Any) -> bytes:
    """A request whose every span the C walk decodes (clean), or one where some are left to the Python decoder."""
    clean = draw(st.booleans())
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = request.resource_spans.add()
        rs.resource.attributes.extend(_attributes(draw, clean))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = draw(texts), draw(texts)
            if not clean and draw(st.integers(0, 3)) == 0:
                ss.scope.attributes.extend(_attributes(draw, clean))
            ss.spans.extend(_drawn_span(draw, clean) for _ in range(draw(st.integers(0, 3))))
    return request.SerializeToString()


GENERATED = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@GENERATED
@given(requests(), st.sampled_from([DEFAULT_LIMITS, SMALL_LIMITS]))
def test_generated_requests_give_the_python_decoders_rows(payload: bytes, limits: SpanLimits) -> None:
    _check(payload, limits)


@GENERATED
@given(st.integers(0, 2**32))
def test_mutated_requests_give_the_python_decoders_rows_or_are_left_to_it(seed: int) -> None:
    rng = random.Random(seed)
    payload = bytearray(_agent_request())
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(len(payload))
        action = rng.randrange(4)
        if action == 0:
            payload[where] = rng.randrange(256)
        elif action == 1:
            del payload[where:where + rng.randint(1, 8)]
        elif action == 2:
            payload[where:where] = struct.pack("<Q", rng.getrandbits(64))[:rng.randint(1, 8)]
        else:
            payload[where] ^= 1 << rng.randrange(8)
    _check(bytes(payload))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_give_the_python_decoders_rows_or_are_left_to_it(payload: bytes) -> None:
    _check(payload)
