"""The requests that once multiplied into gigabytes of rows (issue: resource and scope stored once), for the tests
and `bench/attacks.py --only amplification`."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

MiB = 1024 * 1024


def spans_request(resource: list[KeyValue], spans: int, scope: tuple[str, str] = ("", ""), trace: int = 1) -> bytes:
    """One resource and one scope over `spans` spans of one trace."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(resource)
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = scope
    ss.spans.extend(Span(trace_id=trace.to_bytes(16, "big"), span_id=i.to_bytes(8, "big"), name="s",
                         start_time_unix_nano=1_767_225_600_000_000_000 + i) for i in range(1, spans + 1))
    return request.SerializeToString()


def text_attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def float_attributes(count: int) -> list[KeyValue]:
    """Doubles whose text differs between orjson (`1e-7`) and Python's repr (`1e-07`): the decoders once measured
    such a resource differently and kept or refused the same request."""
    return [KeyValue(key=f"f{i:06d}", value=AnyValue(double_value=1e-7 * (i + 1))) for i in range(count)]


AMPLIFIED = {
    # 4.9 KB gzipped: 1 MB scope name and version on 1,000 spans took the server to 4-5 GB
    "1 MB scope on 1,000 spans": spans_request([text_attribute("service.name", "a")], 1000, ("n" * MiB, "v" * MiB),
                                               trace=1),
    # about 50 KB of float attributes on 5,367 spans: under the old repeated-resource cap by one decoder's count
    "float resource on 5,367 spans": spans_request([text_attribute("service.name", "b"), *float_attributes(2600)],
                                                   5367, trace=2),
    # 48 KiB of resource on 5,367 spans: 250 MiB of rows when each carried it
    "250 MiB of repeated resource": spans_request([text_attribute("service.name", "c"),
                                                   text_attribute("host.notes", "x" * 48 * 1024)], 5367, trace=3),
}


def repeated_key_request() -> bytes:
    """A resource's conversation key is on every row: 300 KiB of it on 1,000 spans would be 300 MB to commit."""
    return spans_request([text_attribute("session.id", "k" * 300 * 1024)], 1000, trace=4)
