"""decode_otlp: protobuf and OTLP/JSON into normalized spans, with per-span problems and kept good spans."""

from __future__ import annotations

import gzip
import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tests.support.otlp_json import T0, request, sid, span, tid
from tracejudge.mapping import OTLPDecodeError, UnsupportedContentTypeError, decode_otlp
from tracejudge.mapping.otlp import SpanLimits


def _pb_request(spans: list[PbSpan]) -> bytes:
    resource_attr = KeyValue(key="service.name", value=AnyValue(string_value="agent"))
    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    rs.resource.attributes.append(resource_attr)
    return ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


def _pb_span(trace: bytes, span_id: bytes, **kw) -> PbSpan:
    s = PbSpan(trace_id=trace, span_id=span_id, name=kw.get("name", "s"), kind=3,
               start_time_unix_nano=T0, end_time_unix_nano=T0 + 5, status=Status(code=2, message="boom"))
    nested = AnyValue()
    nested.kvlist_value.values.append(KeyValue(key="a", value=AnyValue(int_value=1)))
    arr = AnyValue()
    arr.array_value.values.extend([AnyValue(string_value="x"), AnyValue(double_value=1.5),
                                   AnyValue(bool_value=True), AnyValue(bytes_value=b"\x00\x01")])
    s.attributes.extend([KeyValue(key="nested", value=nested), KeyValue(key="arr", value=arr),
                         KeyValue(key="gen_ai.input.messages", value=AnyValue(string_value='[{"role": "user"}]')),
                         KeyValue(key="empty", value=AnyValue(string_value="")), KeyValue(key="unset"),
                         KeyValue(key="tokens", value=AnyValue(int_value=412))])
    return s


def test_protobuf_spans_decode_with_hex_ids_and_any_values() -> None:
    decoded = decode_otlp(_pb_request([_pb_span(b"\x01" * 16, b"\x02" * 8)]), "application/x-protobuf")
    [s] = decoded.spans
    assert (s.trace_id, s.span_id, s.parent_span_id) == ("01" * 16, "02" * 8, None)
    assert s.attributes["nested"] == {"a": 1}
    assert s.attributes["arr"] == ["x", 1.5, True, "AAE="]
    assert s.json_attr("gen_ai.input.messages") == [{"role": "user"}]
    assert (s.attributes["empty"], s.attributes["unset"], s.attributes["tokens"]) == ("", None, 412)
    assert (s.kind, s.status_code, s.status_message, s.service_name) == (3, 2, "boom", "agent")
    assert decoded.problems == []


def test_invalid_protobuf_spans_are_reported_and_the_good_ones_kept() -> None:
    payload = _pb_request([_pb_span(b"\x01" * 16, b"\x02" * 8), _pb_span(b"\x00" * 16, b"\x03" * 8),
                           _pb_span(b"\x01" * 15, b"\x04" * 8), _pb_span(b"\x01" * 16, b"")])
    decoded = decode_otlp(payload, "application/x-protobuf; charset=binary")
    assert [s.span_id for s in decoded.spans] == ["02" * 8]
    reasons = [str(p) for p in decoded.problems]
    assert "spans[1]" in reasons[0] and "trace_id is all zeros" in reasons[0]
    assert "trace_id must be 16 bytes, got 15" in reasons[1]
    assert "span_id is missing" in reasons[2]


def test_protobuf_times_past_int64_are_span_problems_and_the_rest_are_kept() -> None:
    late = _pb_span(b"\x01" * 16, b"\x03" * 8)
    late.start_time_unix_nano = 2**63  # fixed64 on the wire: past what the store keeps (the year 2262)
    last = _pb_span(b"\x01" * 16, b"\x04" * 8)
    last.end_time_unix_nano = 2**64 - 1
    decoded = decode_otlp(_pb_request([_pb_span(b"\x01" * 16, b"\x02" * 8), late, last]), "application/x-protobuf")
    assert [s.span_id for s in decoded.spans] == ["02" * 8]
    reasons = [str(p) for p in decoded.problems]
    assert "start_time_unix_nano" in reasons[0] and "after the year 2262" in reasons[0]
    assert "end_time_unix_nano" in reasons[1] and "after the year 2262" in reasons[1]


def test_otlp_json_with_hex_ids_camel_case_and_string_ints() -> None:
    body = request(({"service.name": "svc"}, [
        span(1, 1, "root", attributes={"n": 3, "f": 0.5, "b": False, "obj": {"k": [1, 2]}}),
        span(1, 2, "child", 1, kind=3, start=5, status=2, message="bad",
             events=[{"name": "gen_ai.user.message", "attributes": {"content": "hi"}}]),
    ]))
    decoded = decode_otlp(json.dumps(body).encode(), "application/json")
    root, child = decoded.spans
    assert root.trace_id == tid(1) and root.attributes["n"] == 3 and root.attributes["b"] is False
    assert root.json_attr("obj") == {"k": [1, 2]}
    assert child.parent_span_id == sid(1) and child.start_ns == T0 + 5_000_000
    assert child.events[0].name == "gen_ai.user.message" and child.events[0].attributes == {"content": "hi"}
    assert (child.status_code, child.status_message) == (2, "bad")


def test_json_span_problems_name_the_span_and_keep_the_rest() -> None:
    good = span(1, 1, "ok")
    bad_id = dict(span(1, 2, "x"), spanId="zz")
    no_trace = {k: v for k, v in span(1, 3, "y").items() if k != "traceId"}
    bad_time = dict(span(1, 4, "z"), startTimeUnixNano="-5")
    bad_kind = dict(span(1, 5, "k"), kind="SERVER")
    decoded = decode_otlp(json.dumps(request(({}, [good, bad_id, no_trace, bad_time, bad_kind]))),
                          "application/json")
    assert [s.span_id for s in decoded.spans] == [sid(1)]
    text = [str(p) for p in decoded.problems]
    assert text[0].startswith("resourceSpans[0].scopeSpans[0].spans[1]") and "span_id 'zz'" in text[0]
    assert "trace_id is missing" in text[1]
    assert "startTimeUnixNano is negative" in text[2]
    assert "kind must be an integer" in text[3]


def test_base64_ids_from_protobufs_canonical_json_mapping_are_accepted() -> None:
    body = request(({}, [dict(span(1, 1, "b64"), traceId="AAAAAAAAAAAAAAAAAAAAAQ==", spanId="AAAAAAAAAAE=")]))
    [s] = decode_otlp(json.dumps(body), "application/json").spans
    assert (s.trace_id, s.span_id) == (tid(1), sid(1))


@pytest.mark.parametrize("payload, content_type, message", [
    (b"\x0a\xff\xff", "application/x-protobuf", "not a valid OTLP protobuf"),
    (b"{not json", "application/json", "not valid JSON"),
    (b"[1, 2]", "application/json", "must be an object"),
    (b'{"resourceSpans": 5}', "application/json", "must be a list"),
    (gzip.compress(b"{}", mtime=0), "text/plain", "unsupported content type"),
])
def test_undecodable_requests_raise_a_precise_error(payload, content_type, message) -> None:
    with pytest.raises(OTLPDecodeError, match=message):
        decode_otlp(payload, content_type)


def test_unsupported_content_type_is_its_own_error() -> None:
    with pytest.raises(UnsupportedContentTypeError):
        decode_otlp(b"", "application/xml")


def test_deeply_nested_any_values_are_a_span_problem_not_a_crash() -> None:
    value: dict = {"stringValue": "leaf"}
    for _ in range(100):
        value = {"arrayValue": {"values": [value]}}
    deep = span(1, 2, "deep")
    deep["attributes"] = [{"key": "deep", "value": value}]
    decoded = decode_otlp(json.dumps(request(({}, [span(1, 1, "ok"), deep]))), "application/json")
    assert len(decoded.spans) == 1 and "nests deeper than 64" in str(decoded.problems[0])


def test_long_values_are_cut_on_span_event_and_link_attributes_alike() -> None:
    limits = SpanLimits(attribute_value_length=10)
    long = "x" * 50
    pb = _pb_span(b"\x01" * 16, b"\x02" * 8)
    pb.events.append(PbSpan.Event(name="e", time_unix_nano=T0,
                                      attributes=[KeyValue(key="v", value=AnyValue(string_value=long))]))
    pb.links.append(PbSpan.Link(trace_id=b"\x03" * 16, span_id=b"\x04" * 8,
                                    attributes=[KeyValue(key="v", value=AnyValue(string_value=long))]))
    decoded = decode_otlp(_pb_request([pb]), "application/x-protobuf", limits)
    [out] = decoded.spans
    assert out.events[0].attributes["v"] == "x" * 10 and out.links[0].attributes["v"] == "x" * 10
    assert decoded.truncated == 1

    body = request(({}, [span(1, 1, "s", events=[{"name": "e", "attributes": {"v": long}}])]))
    decoded = decode_otlp(json.dumps(body), "application/json", limits)
    assert decoded.spans[0].events[0].attributes["v"] == "x" * 10 and decoded.truncated == 1
